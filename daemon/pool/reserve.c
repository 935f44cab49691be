/* SPDX-License-Identifier: MIT */
/* pinbrokerd --reserve-hugepages (reserve.h): the opt-in huge page reservation, moved out of main.c. */
#include "reserve.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "pool.h"
#include "pressure.h"

static int read_u64_file(const char *path, uint64_t *v)
{
	FILE *f = fopen(path, "re");
	unsigned long long x;
	int ok;

	if (!f)
		return -errno;
	ok = fscanf(f, "%llu", &x) == 1;
	fclose(f);
	if (!ok)
		return -EBADMSG;
	*v = x;
	return 0;
}

/*
 * --reserve-hugepages: the opt-in reservation (pinbroker-hugepages.service runs it before the daemon).
 * Raises vm.nr_hugepages by what the budget needs beyond the free huge pages, reads back what the kernel
 * gave, and says so. Exit 0 when the budget fits, 1 when the kernel gave fewer (memory too fragmented).
 */
int reserve_hugepages(const char *proc_root, uint64_t budget_bytes)
{
	char nr_path[4096], mem_path[4096], buf[16384];
	uint64_t nr_now, nr_after, target, free_pages, want;
	struct meminfo m;
	size_t len;
	FILE *f;
	int r;

	snprintf(nr_path, sizeof(nr_path), "%s/proc/sys/vm/nr_hugepages", proc_root);
	snprintf(mem_path, sizeof(mem_path), "%s/proc/meminfo", proc_root);
	r = read_u64_file(nr_path, &nr_now);
	f = r == 0 ? fopen(mem_path, "re") : NULL;
	if (!f) {
		fprintf(stderr, "pinbrokerd: cannot read %s: %s\n", r < 0 ? nr_path : mem_path,
			strerror(r < 0 ? -r : errno));
		return 1;
	}
	len = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	if (pressure_parse_meminfo(buf, len, &m) < 0 || m.hugepage_size_bytes != 2u * 1024 * 1024) {
		fprintf(stderr, "pinbrokerd: %s has no 2 MiB Hugepagesize: the pool's huge pages are 2 MiB\n",
			mem_path);
		return 1;
	}
	free_pages = m.hugepages_free_bytes / m.hugepage_size_bytes;
	want = (budget_bytes + m.hugepage_size_bytes - 1) / m.hugepage_size_bytes;
	target = pool_hugepages_target(budget_bytes, nr_now, free_pages);
	if (target == nr_now) {
		printf("hugetlb: the budget (%llu huge pages) fits in the %llu free; vm.nr_hugepages stays %llu\n",
		       (unsigned long long)want, (unsigned long long)free_pages, (unsigned long long)nr_now);
		return 0;
	}
	f = fopen(nr_path, "we");
	if (!f || fprintf(f, "%llu\n", (unsigned long long)target) < 0 || fclose(f) != 0) {
		int e = errno;

		/* Read-only is no matter of rights: a container's /proc/sys, or a sandbox that left it out. */
		fprintf(stderr, "pinbrokerd: cannot write %s: %s (%s)\n", nr_path, strerror(e),
			e == EROFS ? "it is read-only here: in a container /proc/sys is; under a unit, its "
				     "ReadWritePaths= must name the file, as pinbroker-hugepages.service's does; or "
				     "reserve them at boot with hugepages=N on the kernel command line"
				   : "run as root");
		return 1;
	}
	r = read_u64_file(nr_path, &nr_after);
	if (r < 0)
		nr_after = nr_now;
	printf("hugetlb: the budget needs %llu huge pages, %llu were free: vm.nr_hugepages %llu -> %llu (asked %llu)\n",
	       (unsigned long long)want, (unsigned long long)free_pages, (unsigned long long)nr_now,
	       (unsigned long long)nr_after, (unsigned long long)target);
	if (nr_after < target) {
		fprintf(stderr,
			"pinbrokerd: the kernel gave %llu of the %llu huge pages asked (memory too fragmented now): "
			"reserve them at boot with hugepages=%llu on the kernel command line, or lower the budget\n",
			(unsigned long long)(nr_after > nr_now ? nr_after - nr_now : 0),
			(unsigned long long)(target - nr_now), (unsigned long long)target);
		return 1;
	}
	return 0;
}
