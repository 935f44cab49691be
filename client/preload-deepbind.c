/* SPDX-License-Identifier: MIT */
/*
 * The interposer's dlopen(): libraries loaded with RTLD_DEEPBIND get their driver imports bound to the wrappers.
 *
 * A library dlopen()ed with RTLD_DEEPBIND looks its symbols up in its own scope (itself and its dependencies)
 * before the global one, so when it links libcuda.so.1 its cuMemHostAlloc binds to the driver, not to the
 * LD_PRELOADed wrapper, and its dlsym binds to libc's, not to ours: it pinned 64 MiB unseen (issue 22,
 * finding 6). Stripping RTLD_DEEPBIND would change what every other symbol of that library binds to. Instead,
 * once the loader has relocated the objects that dlopen() brought in, their GOT slots that import one of the
 * driver's host-memory functions, cuGetProcAddress(_v2), dlsym or dlopen are pointed at our stand-ins
 * (pbp_stand_in), as the global scope would have bound them: only those slots change, and only in objects
 * that this deep-bound dlopen() loaded. The rest of the library's deep binding stays as asked.
 *
 * What this cannot reach (the README's list of ways pinned memory escapes): a deep-bound library's
 * constructors, which run inside dlopen() before the slots are rewritten; libraries loaded into another
 * link-map namespace (dlmopen), which have their own libc and driver; a driver linked statically or
 * called through raw ioctls; and addresses a deep-bound library stored before its GOT was rewritten.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "preload-deepbind.h"

#define UNSANITIZED __attribute__((no_sanitize("address", "undefined")))

void *(*pbp_real_dlopen)(const char *, int);

#if defined(__x86_64__)
#define R_SLOT R_X86_64_JUMP_SLOT
#define R_GLOB R_X86_64_GLOB_DAT
#define R_ABS R_X86_64_64
#elif defined(__aarch64__)
#define R_SLOT R_AARCH64_JUMP_SLOT
#define R_GLOB R_AARCH64_GLOB_DAT
#define R_ABS R_AARCH64_ABS64
#endif

UNSANITIZED static void resolve_real_dlopen(void)
{
	static const char *const versions[] = { "GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.1" };
	void *p = NULL;

	for (size_t i = 0; !p && i < sizeof(versions) / sizeof(versions[0]); i++)
		p = dlvsym(RTLD_NEXT, "dlopen", versions[i]);
	if (p)
		pbp_real_dlopen = (void *(*)(const char *, int))(uintptr_t)p;
}

/* The loader relocates these in place where the dynamic section is writable (x86_64, aarch64); else an offset. */
static uintptr_t dyn_ptr(uintptr_t base, uintptr_t p)
{
	return p < base ? p + base : p;
}

/*
 * Point the GOT slots of one object that import a function we stand in for at our stand-in. Slots in its
 * RELRO part [relro_lo, relro_hi) are made writable for the write and read-only again. Returns how many changed.
 */
static int patch_object(uintptr_t base, const ElfW(Dyn) *dyn, uintptr_t relro_lo, uintptr_t relro_hi)
{
	const ElfW(Sym) *symtab = NULL;
	const char *strtab = NULL;
	const ElfW(Rela) *rel[2] = { NULL, NULL };
	size_t relsz[2] = { 0, 0 }, page = (size_t)sysconf(_SC_PAGESIZE);
	int n = 0;

	for (; dyn->d_tag != DT_NULL; dyn++) {
		switch (dyn->d_tag) {
		case DT_SYMTAB:
			symtab = (const void *)dyn_ptr(base, dyn->d_un.d_ptr);
			break;
		case DT_STRTAB:
			strtab = (const void *)dyn_ptr(base, dyn->d_un.d_ptr);
			break;
		case DT_JMPREL:
			rel[0] = (const void *)dyn_ptr(base, dyn->d_un.d_ptr);
			break;
		case DT_PLTRELSZ:
			relsz[0] = dyn->d_un.d_val;
			break;
		case DT_RELA:
			rel[1] = (const void *)dyn_ptr(base, dyn->d_un.d_ptr);
			break;
		case DT_RELASZ:
			relsz[1] = dyn->d_un.d_val;
			break;
		case DT_PLTREL:
			/* x86_64 and aarch64 use RELA only; anything else is not an object we know how to read. */
			if (dyn->d_un.d_val != DT_RELA)
				return 0;
			break;
		default:
			break;
		}
	}
	if (!symtab || !strtab)
		return 0;
	for (int k = 0; k < 2; k++) {
		for (size_t i = 0; rel[k] && i < relsz[k] / sizeof(ElfW(Rela)); i++) {
			const ElfW(Rela) *r = &rel[k][i];
			unsigned type = (unsigned)ELF64_R_TYPE(r->r_info);
			const ElfW(Sym) *sym = &symtab[ELF64_R_SYM(r->r_info)];
			uintptr_t slot = base + r->r_offset, want, pg;
			void *to;

			if ((type != R_SLOT && type != R_GLOB && type != R_ABS) || ELF64_R_SYM(r->r_info) == 0)
				continue;
			/* Imports only: an object's own definition (a -Bsymbolic driver, say) is left alone. */
			if (sym->st_shndx != SHN_UNDEF || !(to = pbp_stand_in(strtab + sym->st_name)))
				continue;
			want = (uintptr_t)to + (type == R_ABS ? (uintptr_t)r->r_addend : 0);
			if (*(uintptr_t *)slot == want)
				continue;
			pg = slot & ~(uintptr_t)(page - 1);
			if (slot >= relro_lo && slot < relro_hi) {
				if (mprotect((void *)pg, page, PROT_READ | PROT_WRITE) < 0)
					continue;
				__atomic_store_n((uintptr_t *)slot, want, __ATOMIC_RELEASE);
				mprotect((void *)pg, page, PROT_READ);
			} else {
				__atomic_store_n((uintptr_t *)slot, want, __ATOMIC_RELEASE);
			}
			n++;
		}
	}
	return n;
}

struct deep_set {
	uintptr_t *bases; /* load addresses of the objects the deep-bound dlopen() brought in */
	size_t n;
	int patched;
};

static int patch_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct deep_set *set = arg;
	const ElfW(Dyn) *dyn = NULL;
	uintptr_t lo = 0, hi = 0, page = (uintptr_t)sysconf(_SC_PAGESIZE);
	const char *base = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
	bool mine = false;

	(void)size;
	for (size_t i = 0; i < set->n && !mine; i++)
		mine = set->bases[i] == info->dlpi_addr;
	base = base ? base + 1 : info->dlpi_name;
	/* The driver itself: its own imports are its business. */
	if (!mine || (base && strncmp(base, "libcuda.so", 10) == 0))
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];

		if (ph->p_type == PT_DYNAMIC)
			dyn = (const void *)(info->dlpi_addr + ph->p_vaddr);
		else if (ph->p_type == PT_GNU_RELRO) {
			/* As the loader protects it: whole pages from its start to its end, rounded down. */
			lo = (info->dlpi_addr + ph->p_vaddr) & ~(page - 1);
			hi = (info->dlpi_addr + ph->p_vaddr + ph->p_memsz) & ~(page - 1);
		}
	}
	if (dyn)
		set->patched += patch_object(info->dlpi_addr, dyn, lo, hi);
	return 0;
}

/*
 * The objects a deep-bound dlopen() loaded are lm and those after it in the namespace's list (lm was not
 * loaded before: pbp_dlopen_slow checked). Objects another thread loads at the same moment come after it
 * too; rewriting their slots is harmless: through the global scope they bind to the stand-ins anyway.
 */
static void bind_deep(struct link_map *lm, const char *file)
{
	struct deep_set set = { 0 };
	size_t n = 0;

	for (struct link_map *l = lm; l; l = l->l_next)
		n++;
	set.bases = calloc(n, sizeof(*set.bases));
	if (!set.bases)
		return;
	for (struct link_map *l = lm; l; l = l->l_next)
		if (l->l_addr)
			set.bases[set.n++] = l->l_addr;
	dl_iterate_phdr(patch_cb, &set);
	free(set.bases);
	pbp_note("dlopen(%s, RTLD_DEEPBIND): %d driver import%s bound to the interposer", file, set.patched,
		 set.patched == 1 ? "" : "s");
}

/* A search list (dlinfo RTLD_DI_SERINFO) of the object that handle names; NULL if none. Free it. */
static Dl_serinfo *search_list(void *handle)
{
	Dl_serinfo size, *si;

	if (dlinfo(handle, RTLD_DI_SERINFOSIZE, &size) < 0 || !(si = malloc(size.dls_size)))
		return NULL;
	if (dlinfo(handle, RTLD_DI_SERINFOSIZE, si) < 0 || dlinfo(handle, RTLD_DI_SERINFO, si) < 0) {
		free(si);
		return NULL;
	}
	return si;
}

/* The folder of the object that holds caller, into dir: what $ORIGIN means in that object's dlopen(). */
static bool caller_origin(void *caller, char *dir, size_t len)
{
	struct link_map *lm = NULL;
	Dl_info info;
	char *slash;
	ssize_t n;

	if (!dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm)
		return false;
	if (lm->l_name && lm->l_name[0]) {
		if (snprintf(dir, len, "%s", lm->l_name) >= (int)len)
			return false;
	} else {
		/* The main program: its l_name is empty. */
		n = readlink("/proc/self/exe", dir, len - 1);
		if (n <= 0)
			return false;
		dir[n] = 0;
	}
	slash = strrchr(dir, '/');
	if (!slash)
		return false;
	*slash = 0;
	return true;
}

/*
 * dlopen() expands $ORIGIN, and looks a name without a slash up along the RPATH/RUNPATH, of the object that
 * called it; called from here, the loader would use ours. So a leading $ORIGIN is expanded here, and for a
 * bare name the caller's own folders (those of its search list that ours lacks: ours holds LD_LIBRARY_PATH
 * and the system's) are tried first. Returns path, filled, or file unchanged.
 */
static const char *caller_path(const char *file, void *caller, char *path, size_t len)
{
	struct link_map *clm = NULL, *self = NULL;
	Dl_serinfo *theirs = NULL, *ours = NULL;
	Dl_info info;
	const char *found = file, *rest = NULL;

	if (strncmp(file, "$ORIGIN/", 8) == 0)
		rest = file + 7;
	else if (strncmp(file, "${ORIGIN}/", 10) == 0)
		rest = file + 9;
	if (rest) {
		char dir[2048];

		if (caller_origin(caller, dir, sizeof(dir)) && snprintf(path, len, "%s%s", dir, rest) < (int)len)
			return path;
		return file;
	}
	if (strchr(file, '/') || !dladdr1(caller, &info, (void **)&clm, RTLD_DL_LINKMAP) || !clm ||
	    !dladdr1((void *)(uintptr_t)caller_path, &info, (void **)&self, RTLD_DL_LINKMAP) || !self)
		return file;
	theirs = search_list(clm);
	ours = search_list(self);
	for (unsigned i = 0; theirs && i < theirs->dls_cnt && found == file; i++) {
		const char *dir = theirs->dls_serpath[i].dls_name;
		bool shared = false;

		for (unsigned k = 0; ours && k < ours->dls_cnt && !shared; k++)
			shared = strcmp(dir, ours->dls_serpath[k].dls_name) == 0;
		if (shared || snprintf(path, len, "%s/%s", dir, file) >= (int)len)
			continue;
		if (access(path, R_OK) == 0)
			found = path;
	}
	free(theirs);
	free(ours);
	return found;
}

/*
 * The C half of dlopen() below, for what it does not jump straight to the real one with: RTLD_DEEPBIND,
 * and any call before the real dlopen is known. caller is dlopen's return address.
 */
UNSANITIZED void *pbp_dlopen_slow(const char *file, int mode, void *caller)
{
	char buf[4096];
	const char *path;
	struct link_map *lm = NULL;
	void *h;

	if (!pbp_real_dlopen)
		resolve_real_dlopen();
	if (!pbp_real_dlopen)
		return NULL;
	if (!(mode & RTLD_DEEPBIND) || (mode & RTLD_NOLOAD) || !file || !pbp_stand_in("dlsym") ||
	    pbp_caller_is_ours(caller))
		return pbp_real_dlopen(file, mode);
	path = caller_path(file, caller, buf, sizeof(buf));
	/* Already loaded: its scope was set when it was, and this dlopen() loads nothing new. */
	h = pbp_real_dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
	if (h) {
		dlclose(h);
		return pbp_real_dlopen(path, mode);
	}
	h = pbp_real_dlopen(path, mode);
	if (h && dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm)
		bind_deep(lm, file);
	return h;
}

__attribute__((constructor)) static void deepbind_init(void)
{
	if (!pbp_real_dlopen)
		resolve_real_dlopen();
}

/*
 * dlopen(file, mode): without RTLD_DEEPBIND, a tail jump to the real one, so that the loader still sees the
 * caller's return address (its RPATH/RUNPATH, $ORIGIN and namespace); else pbp_dlopen_slow with that address.
 */
#if defined(__x86_64__)
__asm__(".text\n"
	".globl dlopen\n"
	".type dlopen, @function\n"
	"dlopen:\n"
	"	.cfi_startproc\n"
	"	testl $8, %esi\n" /* RTLD_DEEPBIND */
	"	jnz 1f\n"
	"	movq pbp_real_dlopen(%rip), %rax\n"
	"	testq %rax, %rax\n"
	"	jz 1f\n"
	"	jmp *%rax\n"
	"1:	movq (%rsp), %rdx\n"
	"	jmp pbp_dlopen_slow\n"
	"	.cfi_endproc\n"
	".size dlopen, .-dlopen\n");
#elif defined(__aarch64__)
__asm__(".text\n"
	".globl dlopen\n"
	".type dlopen, %function\n"
	"dlopen:\n"
	"	tbnz w1, #3, 1f\n" /* RTLD_DEEPBIND */
	"	adrp x9, pbp_real_dlopen\n"
	"	ldr x9, [x9, #:lo12:pbp_real_dlopen]\n"
	"	cbz x9, 1f\n"
	"	br x9\n"
	"1:	mov x2, x30\n"
	"	b pbp_dlopen_slow\n"
	".size dlopen, .-dlopen\n");
#else
#error "libpinbroker-preload: dlopen's tail call is written for x86_64 and aarch64 only"
#endif
