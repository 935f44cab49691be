/* SPDX-License-Identifier: MIT */
/* Telling the daemon what a client's staged copies did (ReportStaging). */
#include "lib-int.h"

#include <errno.h>

int lib_report_staging(pb_client *c, const struct pb_staging_stats *s)
{
	(void)c;
	(void)s;
	return -ENOSYS; /* the daemon's side lands with the ReportStaging message */
}
