/* SPDX-License-Identifier: MIT */
/* The unmodified test programs' checks (target.c, copy_target.c): each failure on stderr and counted, the run goes on. */
#pragma once

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/types.h>
#include <sys/wait.h>

/* The program's count of failed checks: its exit status is 1 when it is not 0. */
extern atomic_int failures;

#define CHECK(cond, ...)                                                                \
	do {                                                                            \
		if (!(cond)) {                                                          \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                                   \
			fputc('\n', stderr);                                            \
			atomic_fetch_add(&failures, 1);                                 \
		}                                                                       \
	} while (0)

/* Reaps child pid (as fork returned it) and counts it: in *hung when its alarm killed it, in *bad when it failed. */
static inline void tally_child(pid_t pid, int *bad, int *hung)
{
	int status;

	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		(*bad)++;
	else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
		(*hung)++;
	else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		(*bad)++;
}
