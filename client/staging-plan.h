/* SPDX-License-Identifier: MIT */
/* Staged copies' decisions, apart from their I/O (lib-staging.c): no CUDA, no broker, no threads. */
#pragma once
