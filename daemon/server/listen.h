/* SPDX-License-Identifier: MIT */
/* The daemon's own listening socket, made without following links and only in a folder nobody else controls. */
#pragma once

/*
 * Create the SOCK_SEQPACKET listening socket at path (used when systemd did
 * not pass one). The socket's folder is created (0755) when missing. It must
 * be owned by root or by the daemon's euid, and must not be writable by other
 * users (nor by a group other than root's or the daemon's) unless it has the
 * sticky bit: whoever can write it could swap the socket under us.
 * Something already at path is removed only when it is a socket nobody
 * answers on; a symlink, a regular file or anything else is left alone.
 * The mode (0660 with group pinbroker, 0666 where that group does not exist)
 * is set at bind through the umask, and the group through fchownat() with
 * AT_SYMLINK_NOFOLLOW, so no path is ever followed to another file.
 * Returns 0 and *ret (non-blocking, close-on-exec), or a negative errno with
 * what to fix already logged: -ENAMETOOLONG, -EINVAL (no file name in path),
 * -EPERM (unsafe folder), -EEXIST (path exists and is not a socket),
 * -EADDRINUSE (a daemon answers there), or the errno of a failed call.
 */
int listen_unix_socket(const char *path, int *ret);

/*
 * Remove the socket at path when the daemon stops, only if a socket is still
 * what is there: unlink() never follows the link itself, but whatever replaced
 * the socket (by root or the folder's owner) is not ours to delete.
 */
void listen_unlink(const char *path);
