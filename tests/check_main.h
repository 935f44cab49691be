/* SPDX-License-Identifier: MIT */
/* The one main() every Check suite shares: fork mode on, normal output, exit status from the failures. */
#pragma once

#include <check.h>
#include <stdlib.h>

/* Define CHECK_MAIN(suite_fn) once per suite file, where suite_fn builds the Suite. */
#define CHECK_MAIN(suite_fn)                                                                                  \
	int main(void)                                                                                       \
	{                                                                                                    \
		SRunner *sr = srunner_create(suite_fn());                                                    \
		int failed;                                                                                  \
                                                                                                             \
		/* Fork mode: a crashing test fails alone, and fixtures start fresh. */                     \
		srunner_set_fork_status(sr, CK_FORK);                                                        \
		srunner_run_all(sr, CK_NORMAL);                                                              \
		failed = srunner_ntests_failed(sr);                                                          \
		srunner_free(sr);                                                                            \
		return failed ? EXIT_FAILURE : EXIT_SUCCESS;                                                 \
	}
