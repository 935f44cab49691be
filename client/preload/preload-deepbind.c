/* SPDX-License-Identifier: MIT */
/*
 * The interposer's dlopen(): libraries loaded with RTLD_DEEPBIND get their driver imports bound to the wrappers.
 *
 * A library dlopen()ed with RTLD_DEEPBIND looks its symbols up in its own scope (itself and its dependencies)
 * before the global one, so when it links libcuda.so.1 its cuMemHostAlloc binds to the driver, not to the
 * LD_PRELOADed wrapper, and its dlsym binds to libc's, not to ours: such a plugin pinned 64 MiB the broker never
 * saw. Stripping RTLD_DEEPBIND would change what every other symbol of that library binds to. Instead,
 * once the loader has relocated the objects that dlopen() brought in, their GOT slots that import one of the
 * driver's host-memory functions, cuGetProcAddress(_v2), dlsym or dlopen are pointed at our stand-ins
 * (pbp_stand_in), as the global scope would have bound them: only those slots change, and only in objects
 * that this deep-bound dlopen() loaded (the object it names, when that was not loaded before), once
 * the loader is done with them: never an object another thread is loading at the same moment, whose RELRO
 * the loader may still be writing. A read-only (RELRO) page is made writable for the store and given its
 * protection back under one lock; a writable one is only stored to. The rest of the library's deep binding
 * stays as asked.
 *
 * What this cannot reach (the README's list of ways pinned memory escapes): a deep-bound library's
 * constructors, which run inside dlopen() before the slots are rewritten; libraries loaded into another
 * link-map namespace (dlmopen), which have their own libc and driver, or with dlmopen(LM_ID_BASE) and
 * RTLD_DEEPBIND into this one (dlmopen is not wrapped); a driver linked statically or
 * called through raw ioctls; and addresses a deep-bound library stored before its GOT was rewritten.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
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
 * Serialises every rewrite of a GOT slot: two deep-bound dlopen()s whose objects share a page (or patch the
 * same object) must not interleave one's mprotect(RW) / store / mprotect(back) with the other's, or one puts
 * the page back to read-only between the other's mprotect and its store. Held only around mprotect() and
 * stores, with signals blocked, so nothing under it can fork, dlopen or re-enter; pthread_atfork keeps it
 * consistent in a child forked by another thread while it was held.
 */
static pthread_mutex_t patch_lock = PTHREAD_MUTEX_INITIALIZER;

/* Deep-bound dlopen()s between their load and the end of their rewrite, in all threads. */
static atomic_int deep_loading;

static void patch_lock_prepare(void)
{
	pthread_mutex_lock(&patch_lock);
}

static void patch_lock_release(void)
{
	pthread_mutex_unlock(&patch_lock);
}

/* In a child forked while another thread was mid-load: that load goes on only in the parent. */
static void patch_lock_child(void)
{
	atomic_store(&deep_loading, 0);
	pthread_mutex_unlock(&patch_lock);
}

/* One object to rewrite: found by dl_iterate_phdr, and held (a RTLD_NOLOAD handle) while it is rewritten. */
struct deep_obj {
	uintptr_t addr;
	const ElfW(Phdr) * phdr;
	ElfW(Half) phnum;
	char *name;
	void *hold;
};

/*
 * The protection the loader left on the page of slot, from the object's program headers: PROT_READ inside
 * its PT_GNU_RELRO pages (whole pages from its start, its end rounded down, as the loader protects them),
 * else its PT_LOAD segment's flags. -1 if no segment holds it.
 */
static int slot_prot(const struct deep_obj *o, uintptr_t slot, uintptr_t page)
{
	int prot = -1;

	for (ElfW(Half) i = 0; i < o->phnum; i++) {
		const ElfW(Phdr) *ph = &o->phdr[i];
		uintptr_t lo = o->addr + ph->p_vaddr, hi = lo + ph->p_memsz;

		if (ph->p_type == PT_GNU_RELRO) {
			lo &= ~(page - 1);
			hi &= ~(page - 1);
			if (slot >= lo && slot < hi)
				return PROT_READ;
		} else if (ph->p_type == PT_LOAD && slot >= lo && slot < hi) {
			prot = ((ph->p_flags & PF_R) ? PROT_READ : 0) | ((ph->p_flags & PF_W) ? PROT_WRITE : 0) |
			       ((ph->p_flags & PF_X) ? PROT_EXEC : 0);
		}
	}
	return prot;
}

/*
 * Point the GOT slots of one object that import a function we stand in for at our stand-in. A slot in a
 * read-only page (its RELRO) is made writable for the store and given its original protection back; a slot
 * in a writable page is stored as is; anything else is left alone. Call with patch_lock held. Returns how
 * many changed.
 */
static int patch_object(const struct deep_obj *o, const ElfW(Dyn) * dyn)
{
	const ElfW(Sym) *symtab = NULL;
	const char *strtab = NULL;
	const ElfW(Rela) * rel[2] = { NULL, NULL };
	size_t relsz[2] = { 0, 0 }, page = (size_t)sysconf(_SC_PAGESIZE);
	uintptr_t base = o->addr;
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
			int prot;

			if ((type != R_SLOT && type != R_GLOB && type != R_ABS) || ELF64_R_SYM(r->r_info) == 0)
				continue;
			/* Imports only: an object's own definition (a -Bsymbolic driver, say) is left alone. */
			if (sym->st_shndx != SHN_UNDEF || !(to = pbp_stand_in(strtab + sym->st_name)))
				continue;
			want = (uintptr_t)to + (type == R_ABS ? (uintptr_t)r->r_addend : 0);
			if (*(uintptr_t *)slot == want)
				continue;
			pg = slot & ~(uintptr_t)(page - 1);
			prot = slot_prot(o, slot, page);
			if (prot < 0 || !(prot & PROT_READ))
				continue;
			if (!(prot & PROT_WRITE)) {
				if (mprotect((void *)pg, page, prot | PROT_WRITE) < 0)
					continue;
				__atomic_store_n((uintptr_t *)slot, want, __ATOMIC_RELEASE);
				mprotect((void *)pg, page, prot);
			} else {
				__atomic_store_n((uintptr_t *)slot, want, __ATOMIC_RELEASE);
			}
			n++;
		}
	}
	return n;
}

/* A growing list of objects, filled inside dl_iterate_phdr (which holds the loader's list lock). */
struct obj_list {
	struct deep_obj *v;
	size_t n, cap;
	const struct obj_list *before; /* for the second walk: the objects loaded before the dlopen() */
	uintptr_t mine;                /* for the second walk: the load address of the dlopen()'s own object */
	bool failed;
};

/*
 * Whether an object was in the list: by address and name, since another thread may have unloaded one and
 * this dlopen() mapped another in its place (two plugins built alike even have their headers at one address).
 */
static bool listed(const struct obj_list *l, const struct dl_phdr_info *info)
{
	for (size_t i = 0; l && i < l->n; i++)
		if (l->v[i].addr == info->dlpi_addr && l->v[i].phdr == info->dlpi_phdr &&
		    strcmp(l->v[i].name, info->dlpi_name ? info->dlpi_name : "") == 0)
			return true;
	return false;
}

static int collect_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct obj_list *l = arg;
	struct deep_obj *o;

	(void)size;
	/* The dlopen()'s own object counts even so: it was not loaded when pbp_dlopen_slow looked. */
	if (l->failed || (listed(l->before, info) && info->dlpi_addr != l->mine))
		return 0;
	/* After the dlopen(): only named objects (a loaded library always has a name; the vDSO and program not). */
	if (l->before && (!info->dlpi_name || !info->dlpi_name[0]))
		return 0;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		struct deep_obj *v = realloc(l->v, cap * sizeof(*v));

		if (!v) {
			l->failed = true;
			return 0;
		}
		l->v = v;
		l->cap = cap;
	}
	o = &l->v[l->n];
	*o = (struct deep_obj){ .addr = info->dlpi_addr, .phdr = info->dlpi_phdr, .phnum = info->dlpi_phnum };
	if (!(o->name = strdup(info->dlpi_name ? info->dlpi_name : ""))) {
		l->failed = true;
		return 0;
	}
	l->n++;
	return 0;
}

/* The program headers of the objects held in a list, read again; phnum stays 0 for one not found. */
static int refresh_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct obj_list *l = arg;

	(void)size;
	for (size_t i = 0; i < l->n; i++) {
		struct deep_obj *o = &l->v[i];

		if (o->hold && o->addr == info->dlpi_addr && info->dlpi_name && strcmp(o->name, info->dlpi_name) == 0) {
			o->phdr = info->dlpi_phdr;
			o->phnum = info->dlpi_phnum;
		}
	}
	return 0;
}

static void free_list(struct obj_list *l)
{
	for (size_t i = 0; i < l->n; i++) {
		free(l->v[i].name);
		if (l->v[i].hold)
			dlclose(l->v[i].hold);
	}
	free(l->v);
	*l = (struct obj_list){ 0 };
}

static const ElfW(Dyn) * dynamic_of(const struct deep_obj *o)
{
	for (ElfW(Half) i = 0; i < o->phnum; i++)
		if (o->phdr[i].p_type == PT_DYNAMIC)
			return (const void *)(o->addr + o->phdr[i].p_vaddr);
	return NULL;
}

/*
 * Rewrite the object this deep-bound dlopen() brought in: lm, its handle's object (loaded by this call, or
 * found loaded while another thread's deep-bound dlopen() may still be rewriting it). Its dependencies loaded
 * with it are left as they bound: telling which of them are its (DT_NEEDED by name) read objects that another
 * thread could unload meanwhile, and a plugin that reaches the driver through a library of its own is listed
 * among what escapes (docs/unmodified-programs.md). Objects another thread is loading at the same moment are
 * not ours: the loader may still be relocating them, and making a page of theirs read-only under it would
 * fault its next relocation. So each candidate is taken with dlopen(RTLD_NOLOAD) by its own name, which
 * waits for any dlopen() in progress (the loader's lock) and holds it loaded while it is rewritten; only the
 * one that is lm itself, in this namespace, is rewritten.
 */
static void bind_deep(struct link_map *lm, const char *file, const struct obj_list *before)
{
	struct obj_list now = { .before = before, .mine = lm->l_addr };
	sigset_t all, old;
	bool *in = NULL;
	int patched = 0;

	dl_iterate_phdr(collect_cb, &now);
	if (now.failed || !(in = calloc(now.n ? now.n : 1, sizeof(*in))))
		goto out;
	for (size_t i = 0; i < now.n; i++) {
		struct deep_obj *o = &now.v[i];
		struct link_map *hl = NULL;

		o->hold = pbp_real_dlopen(o->name, RTLD_LAZY | RTLD_NOLOAD);
		if (o->hold && (dlinfo(o->hold, RTLD_DI_LINKMAP, &hl) < 0 || !hl || hl->l_addr != o->addr ||
				!hl->l_name || strcmp(hl->l_name, o->name) != 0)) {
			dlclose(o->hold);
			o->hold = NULL;
		}
		o->phnum = 0;
		in[i] = o->hold && hl == lm;
	}
	/*
	 * What the first walk saw of an object not held then may be gone (unloaded) or another's (loaded at the
	 * same address since): read the program headers again, now that the objects to rewrite are held.
	 */
	dl_iterate_phdr(refresh_cb, &now);
	for (size_t i = 0; i < now.n; i++)
		if (!now.v[i].phnum)
			in[i] = false;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	pthread_mutex_lock(&patch_lock);
	for (size_t i = 0; i < now.n; i++) {
		const char *base = strrchr(now.v[i].name, '/');
		const ElfW(Dyn) * dyn;

		base = base ? base + 1 : now.v[i].name;
		/* The driver itself: its own imports are its business. */
		if (!in[i] || strncmp(base, "libcuda.so", 10) == 0 || !(dyn = dynamic_of(&now.v[i])))
			continue;
		patched += patch_object(&now.v[i], dyn);
	}
	pthread_mutex_unlock(&patch_lock);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
out:
	free(in);
	/* The holds go after the lock: a last dlclose() runs destructors, which may dlopen(). */
	free_list(&now);
	pbp_note("dlopen(%s, RTLD_DEEPBIND): %d driver import%s bound to the interposer", file, patched,
		 patched == 1 ? "" : "s");
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
	struct obj_list before = { 0 };
	void *h;

	if (!pbp_real_dlopen)
		resolve_real_dlopen();
	if (!pbp_real_dlopen)
		return NULL;
	if (!(mode & RTLD_DEEPBIND) || (mode & RTLD_NOLOAD) || !file || !pbp_stand_in("dlsym") ||
	    pbp_caller_is_ours(caller))
		return pbp_real_dlopen(file, mode);
	path = caller_path(file, caller, buf, sizeof(buf));
	/*
	 * Already loaded: its scope was set when it was, and this dlopen() loads nothing new, so it is left as it
	 * bound. The probe's handle is kept until the real dlopen() has its own: another thread's last dlclose()
	 * (a bind_deep's hold on it, say) in between would unload it, and the real dlopen() would then load it
	 * afresh, not rewritten. But while another thread's deep-bound dlopen() is under way, that thread may have
	 * loaded it and not be done rewriting it: then it is rewritten here too (bind_deep changes only the slots
	 * that differ, under patch_lock). Refused while loaded (a bad mode): asked again below as a load, since
	 * the dlclose() cleared dlerror(); one unloaded meanwhile is then loaded afresh and rewritten.
	 */
	h = pbp_real_dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
	if (h) {
		void *again = pbp_real_dlopen(path, mode);

		dlclose(h);
		if (again && !atomic_load(&deep_loading))
			return again;
		h = again;
	}
	/* Counted before the load: a thread whose probe finds this load's object then sees the count. */
	atomic_fetch_add(&deep_loading, 1);
	/* What was loaded before: the objects this dlopen() brings in are among the others afterwards. */
	dl_iterate_phdr(collect_cb, &before);
	if (!h)
		h = pbp_real_dlopen(path, mode);
	if (h && !before.failed && dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm)
		bind_deep(lm, file, &before);
	free_list(&before);
	atomic_fetch_sub(&deep_loading, 1);
	return h;
}

__attribute__((constructor)) static void deepbind_init(void)
{
	if (!pbp_real_dlopen)
		resolve_real_dlopen();
	pthread_atfork(patch_lock_prepare, patch_lock_release, patch_lock_child);
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
