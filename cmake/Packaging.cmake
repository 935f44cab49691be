# SPDX-License-Identifier: MIT
# Debian packages from `cpack -G DEB` (scripts/build-deb.sh builds them): split the way Debian
# splits a daemon with a client library, along the install components:
#   pinbroker         (daemon)  pinbrokerd, pinctl, the interposer, units, sysusers/tmpfiles
#                               snippets, catalog, /etc/pinbroker, completions, man 5 and 8;
#   libpinbroker0     (lib)     libpinbroker.so.0, all a program linked against it needs;
#   libpinbroker-dev  (dev)     pinbroker.h, libpinbroker.so, libpinbroker.a, pinbroker.pc,
#                               libpinbroker(3).
# So a GPU job's image takes libpinbroker0 alone (the library falls back to ordinary memory
# without a daemon), and building against it takes -dev, without a daemon on the build host.
# The package's maintainer scripts are packaging/deb/ (postinst, prerm, postrm).

set(PINBROKER_DEB_MAINTAINER "pinbroker maintainers <maintainers@pinbroker.invalid>" CACHE STRING
    "Maintainer: field of the Debian packages (put your deployment's contact here)")

set(_deb_dir ${PROJECT_SOURCE_DIR}/packaging/deb)

# Each package carries /usr/share/doc/<package>/copyright, as Debian policy asks, written here from
# LICENSE in the machine-readable format. EXCLUDE_FROM_ALL: only a per-component install (which
# is what CPack runs) takes them; a plain `cmake --install` keeps LICENSE in share/doc/pinbroker.
file(READ ${PROJECT_SOURCE_DIR}/LICENSE _license)
string(REGEX MATCH "Copyright \\(c\\) ([^\n]*)" _m "${_license}")
set(_holder "${CMAKE_MATCH_1}")
string(REGEX REPLACE "^MIT License\n+Copyright[^\n]*\n+" "" _license_body "${_license}")
string(STRIP "${_license_body}" _license_body)
string(REGEX REPLACE "\n\n" "\n.\n" _license_body "${_license_body}")
string(REGEX REPLACE "\n" "\n " _license_body "${_license_body}")
set(_copyright ${PROJECT_BINARY_DIR}/packaging/copyright)
file(WRITE ${_copyright}.tmp
"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: pinbroker
Source: the pinbroker source tree

Files: *
Copyright: ${_holder}
License: Expat
 ${_license_body}
")
file(COPY_FILE ${_copyright}.tmp ${_copyright} ONLY_IF_DIFFERENT)
file(REMOVE ${_copyright}.tmp)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/LICENSE)

# And a Debian changelog (policy 12.7; dpkg-parsechangelog's format), gzipped without a name or
# a time stamp. The versions have no Debian revision (these are native packages), so it is
# changelog.gz, not changelog.Debian.gz.
# The date is the configure time's, or SOURCE_DATE_EPOCH's (string(TIMESTAMP) reads it).
string(TIMESTAMP _deb_date "%a, %d %b %Y %H:%M:%S +0000" UTC)
set(_deb_changelog ${PROJECT_BINARY_DIR}/packaging/changelog.Debian)
foreach(_pkg pinbroker libpinbroker0 libpinbroker-dev)
  file(WRITE ${_deb_changelog}.${_pkg}
"${_pkg} (${PROJECT_VERSION}) unstable; urgency=medium

  * Built by CPack from the pinbroker source tree; the upstream changes are in
    /usr/share/doc/pinbroker/CHANGELOG.md.

 -- ${PINBROKER_DEB_MAINTAINER}  ${_deb_date}
")
endforeach()
find_program(PINBROKER_GZIP gzip)
mark_as_advanced(PINBROKER_GZIP)

foreach(_c daemon:pinbroker lib:libpinbroker0 dev:libpinbroker-dev)
  string(REPLACE ":" ";" _c ${_c})
  list(GET _c 0 _comp)
  list(GET _c 1 _pkg)
  install(FILES ${_copyright} DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${_pkg} COMPONENT ${_comp} EXCLUDE_FROM_ALL)
  if(PINBROKER_GZIP)
    install(CODE "
      set(_d \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_DATADIR}/doc/${_pkg}\")
      file(MAKE_DIRECTORY \"\${_d}\")
      execute_process(COMMAND \"${PINBROKER_GZIP}\" -9nc \"${_deb_changelog}.${_pkg}\"
                      OUTPUT_FILE \"\${_d}/changelog.gz\" RESULT_VARIABLE _rc)
      if(NOT _rc EQUAL 0)
        message(FATAL_ERROR \"gzip of ${_deb_changelog}.${_pkg} failed\")
      endif()
      list(APPEND CMAKE_INSTALL_MANIFEST_FILES \"\${_d}/changelog.gz\")
    " COMPONENT ${_comp} EXCLUDE_FROM_ALL)
  endif()
endforeach()

set(CPACK_PACKAGE_NAME pinbroker)
set(CPACK_PACKAGE_VENDOR "The pinbroker authors")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${PINBROKER_DEB_MAINTAINER}")
set(CPACK_GENERATOR DEB)
set(CPACK_SOURCE_GENERATOR "")
# The install rules write absolute paths of their own (/etc/pinbroker for prefix /usr, the unit
# folder systemd.pc names), so CPack installs with DESTDIR into its staging root.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
# At cpack time: refuse a package from a tree configured for another prefix (its libdir, the
# units' ExecStart and the config path all follow the configure-time prefix).
set(_deb_check ${PROJECT_BINARY_DIR}/packaging/CPackProjectConfig.cmake)
file(WRITE ${_deb_check} "
if(CPACK_GENERATOR STREQUAL \"DEB\" AND NOT CPACK_INSTALL_PREFIX STREQUAL \"/usr\")
  message(FATAL_ERROR \"pinbroker: a Debian package needs a tree configured with -DCMAKE_INSTALL_PREFIX=/usr \"
                      \"(this one: \${CPACK_INSTALL_PREFIX}); scripts/build-deb.sh configures one\")
endif()
")
set(CPACK_PROJECT_CONFIG_FILE ${_deb_check})
# Debian ships binaries stripped (their symbols belong in a -dbgsym package) and man pages
# gzipped; the staged man pages are compressed just before the packages are made.
set(CPACK_STRIP_FILES ON)
set(CPACK_PRE_BUILD_SCRIPTS ${_deb_dir}/gzip-man.cmake)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL daemon lib dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_DEBIAN_PACKAGE_RELEASE "")
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Maintainer scripts and conffiles keep the modes dpkg wants (0755, 0644), whatever the checkout's.
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# Depends: from dpkg-shlibdeps where it runs (dpkg-dev), else the libraries named by hand.
set(_shlibdeps OFF)
find_program(PINBROKER_DPKG_SHLIBDEPS dpkg-shlibdeps)
mark_as_advanced(PINBROKER_DPKG_SHLIBDEPS)
if(PINBROKER_DPKG_SHLIBDEPS)
  execute_process(COMMAND ${PINBROKER_DPKG_SHLIBDEPS} --version RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
  if(_rc EQUAL 0)
    set(_shlibdeps ON)
  endif()
endif()
set(_v "${PROJECT_VERSION}")

# pinbroker: the daemon and pinctl.
set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME pinbroker)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_DAEMON_DESCRIPTION "host-wide broker for pinned (page-locked) GPU host memory
pinbrokerd owns a host's pinned-memory budget and keeps a warm pool of locked,
pre-faulted memfd memory, which it lends to GPU jobs as leases over a Unix
socket. It watches memory pressure, refuses new leases when memory gets tight
and revokes them before the host swaps.

This package has the daemon (socket-activated: pinbrokerd.socket is enabled
on install), the pinctl admin command, the LD_PRELOAD interposer for
unmodified CUDA programs, the systemd units, and the pinbroker system user
and group. Users in group pinbroker may connect.")
# triggers: ldconfig for the interposer in the libdir (it has no SONAME: an LD_PRELOAD module).
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA
    ${_deb_dir}/postinst ${_deb_dir}/prerm ${_deb_dir}/postrm ${_deb_dir}/conffiles ${_deb_dir}/triggers)
set(CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS "libpinbroker0 (= ${_v})")

# libpinbroker0: the shared library (SONAME libpinbroker.so.0). Its shlibs file lets other
# packages' dpkg-shlibdeps depend on it (GENERATE_SHLIBS is not per component in CPack; the
# interposer, without a SONAME, gets no line). The ldconfig trigger is what lintian asks for;
# CPack adds ldconfig calls of its own to a package without a postinst (harmless, a warning).
set(CPACK_DEBIAN_LIB_PACKAGE_NAME libpinbroker0)
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_LIB_DESCRIPTION "client library for the pinbroker pinned-memory broker
libpinbroker borrows pinned, CUDA-registered host memory from pinbrokerd and
maps it into the calling process. When the broker refuses or is not running
it hands out ordinary memory, flagged, so a job never fails for lack of
pinned memory. CUDA is loaded at run time: the library links against no CUDA
library.")
set(CPACK_DEBIAN_LIB_PACKAGE_CONTROL_EXTRA ${_deb_dir}/triggers)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")

# libpinbroker-dev: what building against the library takes.
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libpinbroker-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_DESCRIPTION "client library for the pinbroker pinned-memory broker (development)
The header pinbroker.h, the libpinbroker.so link, the self-contained static
library libpinbroker.a, pkg-config's pinbroker.pc and the libpinbroker(3)
manual page.")
# pkg-config --static names libprotobuf-c (pinbroker.pc's Requires.private).
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libpinbroker0 (= ${_v}), libprotobuf-c-dev")

if(_shlibdeps)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
  # pinctl needs libpinbroker.so.0, which is in the libpinbroker0 package's staging folder, not
  # this one's: dpkg-shlibdeps looks there too, and the Depends above names the package.
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS
      "${PROJECT_BINARY_DIR}/_CPack_Packages/Linux/DEB/pinbroker-${_v}-Linux/lib${CMAKE_INSTALL_FULL_LIBDIR}")
else()
  message(STATUS "dpkg-shlibdeps not usable (apt-get install dpkg-dev): Debian packages get hand-written Depends")
  string(APPEND CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS ", libc6 (>= 2.34), libev4 (>= 1:4.04), libprotobuf-c1 (>= 1.0.1), libsystemd0")
  set(CPACK_DEBIAN_LIB_PACKAGE_DEPENDS "libc6 (>= 2.34), libprotobuf-c1 (>= 1.0.1)")
endif()

include(CPack)
