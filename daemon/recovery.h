/* SPDX-License-Identifier: MIT */
/* Crash and restart recovery through systemd's fd store: pool memfds plus a small state memfd. */
#pragma once

struct broker;

/* At start-up: adopt chunks and leases stored by the previous instance (orphaned until re-declared). */
void recovery_adopt(struct broker *b);
/* Store the current pool's chunks and start keeping the state memfd current. */
void recovery_store_pool(struct broker *b);
/* At clean shutdown: clear the fd store, so a deliberate stop starts clean. */
void recovery_save_state(struct broker *b);
