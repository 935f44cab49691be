/* SPDX-License-Identifier: MIT */
/* Staged copies: the ring, its threads and the pipelined copy (staging.h). */
#include "lib-int.h"
#include "staging.h"
