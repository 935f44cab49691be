/* SPDX-License-Identifier: MIT */
/* What preload.c and preload-deepbind.c (the interposer's dlopen for RTLD_DEEPBIND) share; all hidden. */
#pragma once

#include <stdbool.h>

#define PBP_HIDDEN __attribute__((visibility("hidden")))

/*
 * Our stand-in for an import named name that a deep-bound library must not bind past (a driver host-memory
 * function, cuGetProcAddress(_v2), dlsym, dlopen), or NULL: another name, or the interposer is off.
 */
PBP_HIDDEN void *pbp_stand_in(const char *name);
/* Whether a return address is in this object or in libpinbroker (their calls get the real thing). */
PBP_HIDDEN bool pbp_caller_is_ours(void *caller);
/* One line of the interposer's log (shown under PINBROKER_PRELOAD_LOG=1). */
PBP_HIDDEN void pbp_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The real dlopen once known, and the C half of ours (file, mode, and dlopen's return address). */
PBP_HIDDEN extern void *(*pbp_real_dlopen)(const char *, int);
PBP_HIDDEN void *pbp_dlopen_slow(const char *file, int mode, void *caller);
