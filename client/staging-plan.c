/* SPDX-License-Identifier: MIT */
/* Staged copies' decisions (staging-plan.h). */
#include "staging-plan.h"
