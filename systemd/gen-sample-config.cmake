# SPDX-License-Identifier: MIT
# Writes OUT from `DAEMON --sample-config`, or copies FALLBACK when the daemon cannot print one
# (an older daemon without the option, or a binary that cannot run on the build host).
execute_process(COMMAND "${DAEMON}" --sample-config
                OUTPUT_VARIABLE sample RESULT_VARIABLE rc ERROR_QUIET TIMEOUT 10)
if(rc EQUAL 0 AND sample MATCHES "budget")
  file(WRITE "${OUT}.tmp" "${sample}")
else()
  message(STATUS "pinbrokerd --sample-config failed (${rc}); installing the committed sample")
  configure_file("${FALLBACK}" "${OUT}.tmp" COPYONLY)
endif()
# Only touch OUT when it changes, so installs stay quiet.
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUT}.tmp" "${OUT}")
file(REMOVE "${OUT}.tmp")
