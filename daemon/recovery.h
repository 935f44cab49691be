/* SPDX-License-Identifier: MIT */
/* Crash and restart recovery through systemd's fd store: pool memfds plus a small state memfd. */
#pragma once

struct broker;

/*
 * Under systemd (with FileDescriptorStoreMax=): adopt the chunks and leases a
 * previous instance kept in the fd store (leases come back ORPHANED until
 * their clients re-declare them, and are reclaimed after redeclare-grace-ms),
 * then keep storing every new chunk and a state memfd describing who holds
 * what. Call after the pool and lease table exist, before prewarming.
 * Without systemd it does nothing: a restart starts clean.
 */
void recovery_init(struct broker *b);
/* Stop watching; at a clean stop the pool's destroy hook empties the store. */
void recovery_fini(struct broker *b);
