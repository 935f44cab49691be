# SPDX-License-Identifier: MIT
# Writes OUT from `DAEMON --config-man`: pinbrokerd.conf(5) from the daemon's key table.
execute_process(COMMAND "${DAEMON}" --config-man OUTPUT_VARIABLE page RESULT_VARIABLE rc TIMEOUT 10)
if(NOT rc EQUAL 0 OR NOT page MATCHES "\\.TH PINBROKERD\\.CONF 5")
  message(FATAL_ERROR "${DAEMON} --config-man failed (${rc})")
endif()
file(WRITE "${OUT}.tmp" "${page}")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUT}.tmp" "${OUT}")
file(REMOVE "${OUT}.tmp")
