# SPDX-License-Identifier: MIT
"""Print the site directory this interpreter searches for pure-Python packages under a prefix (argv[1]).

Debian's python3 searches /usr/local/lib/python3.X/dist-packages (scheme posix_local, whose paths add
the "local" itself) and /usr/lib/python3/dist-packages (deb_system), not the upstream site-packages.
"""
import sys
import sysconfig

prefix = sys.argv[1].rstrip("/") or "/"
schemes = sysconfig.get_scheme_names()
if prefix == "/usr/local" and "posix_local" in schemes:
    print(sysconfig.get_path("purelib", "posix_local", vars={"base": "/usr"}))
elif prefix == "/usr" and "deb_system" in schemes:
    print(sysconfig.get_path("purelib", "deb_system", vars={"base": "/usr"}))
else:
    print(sysconfig.get_path("purelib", "posix_prefix", vars={"base": prefix}))
