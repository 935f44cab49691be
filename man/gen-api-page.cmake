# SPDX-License-Identifier: MIT
# Writes OUT, libpinbroker(3): TEMPLATE with @PROJECT_VERSION@ filled in and its
# `.\" pinbroker.h: ...` lines filled from the doc comments of HEADER by gen-api-man.awk.
# -DAWK= -DHEADER= -DTEMPLATE= -DSCRIPT= -DVERSION= -DOUT=
set(PROJECT_VERSION "${VERSION}")
file(READ "${TEMPLATE}" tmpl)
string(CONFIGURE "${tmpl}" tmpl @ONLY)
file(WRITE "${OUT}.in" "${tmpl}")
execute_process(COMMAND "${AWK}" -v "template=${OUT}.in" -f "${SCRIPT}" "${HEADER}"
                OUTPUT_FILE "${OUT}.tmp" ERROR_VARIABLE err RESULT_VARIABLE rc)
file(REMOVE "${OUT}.in")
if(err)
  message("${err}")
endif()
if(NOT rc EQUAL 0)
  file(REMOVE "${OUT}.tmp")
  message(FATAL_ERROR "${AWK} -f ${SCRIPT} ${HEADER} failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUT}.tmp" "${OUT}")
file(REMOVE "${OUT}.tmp")
