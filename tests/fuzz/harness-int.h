/* SPDX-License-Identifier: MIT */
/* What the harness's files share beyond harness.h: set-up, reset and ops (harness.c), checks, seams. */
#pragma once

#include <ev.h>

#include "harness.h"
#include "lease.h"

#define FZ_PAGE_BYTES 4096u

/* harness.c: free the connections closed so far, as the daemon's ev_check watcher does after each callback. */
void fz_reap(struct fz *f);

/* harness-check.c: once per input, the reverse walk and the cursor chain agree with the forward walk. */
void fz_check_order(struct fz *f);
/* harness-check.c: lease l's chunk fds went to another uid: none of its chunks may be pooled or lent elsewhere. */
void fz_taint_model_add(struct fz *f, const struct lease *l);

/*
 * harness-seams.c: abort unless the link-time seams reach the daemon and libev (a timer fires when the
 * modelled clock moves on, a sealed memfd never touched reads as whole). Once, at start-up.
 */
void fz_check_seams(struct ev_loop *loop);
