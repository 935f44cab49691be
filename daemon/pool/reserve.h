/* SPDX-License-Identifier: MIT */
/* pinbrokerd --reserve-hugepages: raise vm.nr_hugepages to what the budget needs (pinbroker-hugepages.service). */
#pragma once

#include <stdint.h>

/*
 * Raise <proc_root>/proc/sys/vm/nr_hugepages by what budget_bytes needs beyond the free huge pages, read back
 * what the kernel gave, and say so on stdout (errors on stderr). Returns the exit status: 0 when the budget
 * fits, 1 when it does not (fewer pages given, or the files cannot be read or written).
 */
int reserve_hugepages(const char *proc_root, uint64_t budget_bytes);
