/* SPDX-License-Identifier: MIT */
/*
 * A plain library another thread dlopen()s and dlclose()s in a loop while plugins are loaded with
 * RTLD_DEEPBIND (tests/preload/deep_race.c). Its read-only-after-relocation table holds many pointers to
 * dlsym and dlopen, imports the interposer stands in for, so the loader writes many slots in its RELRO pages
 * before protecting them: if a deep-bound dlopen() elsewhere rewrote and write-protected those pages while
 * the loader was still relocating them, the loader's next store would fault.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>

#define S ((void *)(uintptr_t)dlsym)
#define O ((void *)(uintptr_t)dlopen)
#define S16 S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S
#define O16 O, O, O, O, O, O, O, O, O, O, O, O, O, O, O, O
#define S256 S16, S16, S16, S16, S16, S16, S16, S16, S16, S16, S16, S16, S16, S16, S16, S16
#define O256 O16, O16, O16, O16, O16, O16, O16, O16, O16, O16, O16, O16, O16, O16, O16, O16
#define SO512 S256, O256
#define SO8192 \
	SO512, SO512, SO512, SO512, SO512, SO512, SO512, SO512, SO512, SO512, SO512, SO512, SO512, SO512, SO512, SO512

__attribute__((visibility("default"))) uintptr_t deep_busy_sum(void);

/* 8192 pointers: 64 KiB of RELRO, all of it relocated at load. */
static void *const table[] = { SO8192 };

uintptr_t deep_busy_sum(void)
{
	uintptr_t s = 0;

	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		s += (uintptr_t)table[i];
	return s;
}
