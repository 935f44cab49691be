# SPDX-License-Identifier: MIT
# CPACK_PRE_BUILD_SCRIPTS step (cmake/Packaging.cmake): gzips the staged man pages, as Debian
# ships them (policy 12.1), once CPack has installed each package's files and before it makes
# the packages. -n leaves out the name and time stamp, so the bytes depend on the page alone.
file(GLOB_RECURSE _pages LIST_DIRECTORIES false "${CPACK_TEMPORARY_INSTALL_DIRECTORY}/*")
foreach(_p IN LISTS _pages)
  if(_p MATCHES "/usr/share/man/man[0-9]/[^/]+\\.[0-9]$")
    execute_process(COMMAND gzip -9nf "${_p}" RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "gzip ${_p} failed")
    endif()
  endif()
endforeach()
