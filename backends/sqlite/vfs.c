// A thin SQLite VFS over "unix" that saves system calls on the commit path.
// See vfs.go for why and for the rules it keeps; this file only forwards.
//
// The SQLite declarations below are the stable C ABI of sqlite3.h (the
// sqlite3_file, sqlite3_io_methods and sqlite3_vfs objects have not changed
// layout since version 3 of the VFS, 2011); the functions are the ones
// go-sqlite3 compiles in, resolved when the program is linked.

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

typedef long long sqlite3_int64;
typedef struct sqlite3_file sqlite3_file;
typedef struct sqlite3_io_methods sqlite3_io_methods;
typedef struct sqlite3_vfs sqlite3_vfs;
typedef void (*sqlite3_syscall_ptr)(void);

struct sqlite3_file {
	const sqlite3_io_methods *pMethods;
};

struct sqlite3_io_methods {
	int iVersion;
	int (*xClose)(sqlite3_file *);
	int (*xRead)(sqlite3_file *, void *, int iAmt, sqlite3_int64 iOfst);
	int (*xWrite)(sqlite3_file *, const void *, int iAmt, sqlite3_int64 iOfst);
	int (*xTruncate)(sqlite3_file *, sqlite3_int64 size);
	int (*xSync)(sqlite3_file *, int flags);
	int (*xFileSize)(sqlite3_file *, sqlite3_int64 *pSize);
	int (*xLock)(sqlite3_file *, int);
	int (*xUnlock)(sqlite3_file *, int);
	int (*xCheckReservedLock)(sqlite3_file *, int *pResOut);
	int (*xFileControl)(sqlite3_file *, int op, void *pArg);
	int (*xSectorSize)(sqlite3_file *);
	int (*xDeviceCharacteristics)(sqlite3_file *);
	int (*xShmMap)(sqlite3_file *, int iPg, int pgsz, int, void volatile **);
	int (*xShmLock)(sqlite3_file *, int offset, int n, int flags);
	void (*xShmBarrier)(sqlite3_file *);
	int (*xShmUnmap)(sqlite3_file *, int deleteFlag);
	int (*xFetch)(sqlite3_file *, sqlite3_int64 iOfst, int iAmt, void **pp);
	int (*xUnfetch)(sqlite3_file *, sqlite3_int64 iOfst, void *p);
};

struct sqlite3_vfs {
	int iVersion;
	int szOsFile;
	int mxPathname;
	sqlite3_vfs *pNext;
	const char *zName;
	void *pAppData;
	int (*xOpen)(sqlite3_vfs *, const char *zName, sqlite3_file *, int flags, int *pOutFlags);
	int (*xDelete)(sqlite3_vfs *, const char *zName, int syncDir);
	int (*xAccess)(sqlite3_vfs *, const char *zName, int flags, int *pResOut);
	int (*xFullPathname)(sqlite3_vfs *, const char *zName, int nOut, char *zOut);
	void *(*xDlOpen)(sqlite3_vfs *, const char *zFilename);
	void (*xDlError)(sqlite3_vfs *, int nByte, char *zErrMsg);
	void (*(*xDlSym)(sqlite3_vfs *, void *, const char *zSymbol))(void);
	void (*xDlClose)(sqlite3_vfs *, void *);
	int (*xRandomness)(sqlite3_vfs *, int nByte, char *zOut);
	int (*xSleep)(sqlite3_vfs *, int microseconds);
	int (*xCurrentTime)(sqlite3_vfs *, double *);
	int (*xGetLastError)(sqlite3_vfs *, int, char *);
	int (*xCurrentTimeInt64)(sqlite3_vfs *, sqlite3_int64 *);
	int (*xSetSystemCall)(sqlite3_vfs *, const char *zName, sqlite3_syscall_ptr);
	sqlite3_syscall_ptr (*xGetSystemCall)(sqlite3_vfs *, const char *zName);
	const char *(*xNextSystemCall)(sqlite3_vfs *, const char *zName);
};

#define SQLITE_OK 0
#define SQLITE_ERROR 1
#define SQLITE_NOMEM 7
#define SQLITE_IOERR 10
#define SQLITE_CANTOPEN 14
#define SQLITE_OPEN_READONLY 0x00000001
#define SQLITE_OPEN_MAIN_DB 0x00000100
#define SQLITE_OPEN_WAL 0x00080000
#define SQLITE_LOCK_NONE 0
#define SQLITE_LOCK_SHARED 1
#define SQLITE_SHM_UNLOCK 1
#define SQLITE_SHM_LOCK 2
// The wal-index lock that a write transaction holds (WAL_WRITE_LOCK in
// SQLite's wal.c).
#define WAL_WRITE_LOCK 0
#define SQLITE_SHM_EXCLUSIVE 8
#define SQLITE_IOCAP_POWERSAFE_OVERWRITE 0x00001000

extern sqlite3_vfs *sqlite3_vfs_find(const char *zVfsName);
extern int sqlite3_vfs_register(sqlite3_vfs *, int makeDflt);
extern sqlite3_file *sqlite3_database_file_object(const char *);
extern void *sqlite3_malloc64(unsigned long long);
extern void *sqlite3_realloc64(void *, unsigned long long);
extern void sqlite3_free(void *);
extern const char *sqlite3_create_filename(const char *zDatabase, const char *zJournal, const char *zWal, int nParam, const char **azParam);
extern void sqlite3_free_filename(const char *);
extern int sqlite3_uri_boolean(const char *zFile, const char *zParam, int bDefault);

#include "vfs.h"

// A WAL frame is a 24-byte header and a page; the header's second word is
// non-zero in the last frame of a transaction (the commit frame).
#define WAL_FRAME_HDR 24
// Writes are gathered up to this many bytes (a transaction larger than
// that goes out in several writes). The unix VFS writes at most 128 KiB - 1
// bytes per call (seekAndWriteFd masks the size with 0x1ffff).
#define BUF_MAX (120 << 10)

typedef struct shim_file shim_file;
struct shim_file {
	sqlite3_file base;
	sqlite3_file *real; // the unix file, allocated right after this struct
	int is_wal;
	shim_file *wal; // main database: the WAL file of the same connection
	shim_file *db;  // WAL: the main database file of the same connection

	// WAL only: bytes [buf_off, buf_off+n) are written to buf, not yet
	// to the file.
	char *buf;
	int n, cap;
	sqlite3_int64 buf_off;
	sqlite3_int64 last_end; // end of the last write, gathered or not
	int commit_hdr;         // the last write was a commit frame's header

	// Main database of the writer connection only (URI parameter
	// YIRANGMQ_WRITER_PARAM): the WAL write lock is kept between
	// transactions (see shim_shm_lock). keep_write: enabled;
	// write_held: held at the system level; write_taken: SQLite holds
	// it (between its lock and unlock).
	int keep_write, write_held, write_taken;
};

// The registered VFS. SQLite's VFS list is process-wide, so these are
// too: filled once by register_vfs and never changed after.
static sqlite3_vfs *real_vfs;
static sqlite3_vfs shim_vfs;
static const sqlite3_io_methods shim_methods;
static pthread_once_t register_once = PTHREAD_ONCE_INIT;
static int register_rc = SQLITE_ERROR;

// flush writes the gathered bytes out. They are dropped even when the write
// fails: the error goes to the operation that asked for the flush, which
// SQLite then fails (and, for a write, read or sync of the WAL, rolls the
// transaction back). The two callers that cannot report it, a shm unlock
// and the barrier, only ever find frames of a transaction that was rolled
// back, which no one will read (see shim_open and shim_shm_lock).
static int flush(shim_file *p) {
	if (p->n == 0) {
		return SQLITE_OK;
	}
	int n = p->n;
	p->n = 0;
	return p->real->pMethods->xWrite(p->real, p->buf, n, p->buf_off);
}

static int shim_close(sqlite3_file *f) {
	shim_file *p = (shim_file *)f;
	int rc = flush(p);
	sqlite3_free(p->buf);
	p->buf = 0;
	if (p->db && p->db->wal == p) {
		p->db->wal = 0;
	}
	if (p->wal && p->wal->db == p) {
		p->wal->db = 0;
	}
	int rc2 = p->real->pMethods->xClose(p->real);
	return rc != SQLITE_OK ? rc : rc2;
}

static int shim_read(sqlite3_file *f, void *data, int amt, sqlite3_int64 off) {
	shim_file *p = (shim_file *)f;
	int rc = flush(p);
	if (rc != SQLITE_OK) {
		return rc;
	}
	return p->real->pMethods->xRead(p->real, data, amt, off);
}

static uint32_t get_u32(const unsigned char *b) {
	return ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | b[3];
}

// shim_write gathers appends to a WAL and writes them at the end of the
// commit frame; everything else goes straight through.
static int shim_write(sqlite3_file *f, const void *data, int amt, sqlite3_int64 off) {
	shim_file *p = (shim_file *)f;
	if (!p->is_wal) {
		return p->real->pMethods->xWrite(p->real, data, amt, off);
	}
	int end_of_commit = p->commit_hdr && amt != WAL_FRAME_HDR;
	p->commit_hdr = amt == WAL_FRAME_HDR && get_u32((const unsigned char *)data + 4) != 0;

	if (!(p->n > 0 && off == p->buf_off + p->n && p->n + amt <= BUF_MAX)) {
		int rc = flush(p);
		if (rc != SQLITE_OK) {
			return rc;
		}
		if (off < p->last_end || amt > BUF_MAX) {
			// A frame rewritten within its transaction, a WAL header
			// after a restart: not an append, write it now.
			p->last_end = off + amt;
			return p->real->pMethods->xWrite(p->real, data, amt, off);
		}
		p->buf_off = off;
	}
	if (p->n + amt > p->cap) {
		int cap = p->cap ? p->cap : 32 << 10;
		while (cap < p->n + amt) {
			cap *= 2;
		}
		if (cap > BUF_MAX) {
			cap = BUF_MAX;
		}
		char *b = sqlite3_realloc64(p->buf, (unsigned long long)cap);
		if (!b) {
			int rc = flush(p);
			p->last_end = off + amt;
			return rc != SQLITE_OK ? rc : p->real->pMethods->xWrite(p->real, data, amt, off);
		}
		p->buf = b;
		p->cap = cap;
	}
	memcpy(p->buf + p->n, data, (size_t)amt);
	p->n += amt;
	p->last_end = off + amt;
	if (end_of_commit) {
		return flush(p);
	}
	return SQLITE_OK;
}

static int shim_truncate(sqlite3_file *f, sqlite3_int64 size) {
	shim_file *p = (shim_file *)f;
	int rc = flush(p);
	if (rc != SQLITE_OK) {
		return rc;
	}
	if (size < p->last_end) {
		p->last_end = size;
	}
	return p->real->pMethods->xTruncate(p->real, size);
}

static int shim_sync(sqlite3_file *f, int flags) {
	shim_file *p = (shim_file *)f;
	int rc = flush(p);
	if (rc != SQLITE_OK) {
		return rc;
	}
	return p->real->pMethods->xSync(p->real, flags);
}

static int shim_file_size(sqlite3_file *f, sqlite3_int64 *size) {
	shim_file *p = (shim_file *)f;
	int rc = flush(p);
	if (rc != SQLITE_OK) {
		return rc;
	}
	return p->real->pMethods->xFileSize(p->real, size);
}

static int shim_lock(sqlite3_file *f, int lock) {
	shim_file *p = (shim_file *)f;
	return p->real->pMethods->xLock(p->real, lock);
}

static int shim_unlock(sqlite3_file *f, int lock) {
	shim_file *p = (shim_file *)f;
	return p->real->pMethods->xUnlock(p->real, lock);
}

static int shim_check_reserved(sqlite3_file *f, int *out) {
	shim_file *p = (shim_file *)f;
	return p->real->pMethods->xCheckReservedLock(p->real, out);
}

static int shim_file_control(sqlite3_file *f, int op, void *arg) {
	shim_file *p = (shim_file *)f;
	int rc = flush(p);
	if (rc != SQLITE_OK) {
		return rc;
	}
	return p->real->pMethods->xFileControl(p->real, op, arg);
}

static int shim_sector_size(sqlite3_file *f) {
	shim_file *p = (shim_file *)f;
	return p->real->pMethods->xSectorSize(p->real);
}

static int shim_device_characteristics(sqlite3_file *f) {
	shim_file *p = (shim_file *)f;
	return p->real->pMethods->xDeviceCharacteristics(p->real);
}

static int shim_shm_map(sqlite3_file *f, int pg, int pgsz, int extend, void volatile **pp) {
	shim_file *p = (shim_file *)f;
	return p->real->pMethods->xShmMap(p->real, pg, pgsz, extend, pp);
}

// The WAL's gathered bytes must be in the file before other connections
// can learn of them through the wal-index. A commit flushes at its commit
// frame; flushing again before any shm unlock and at the barrier that
// publishes a new wal-index header is a guard that costs a comparison.
//
// An unlock is always passed on, even when the flush fails: SQLite ignores
// the result of an unlock (walUnlockShared, walUnlockExclusive) and takes
// the lock as released, so a lock kept here would stay held by this
// connection for good, and the next write transaction would wait for it
// until busy_timeout and fail with SQLITE_BUSY, for ever.
static int shim_shm_lock(sqlite3_file *f, int ofst, int n, int flags) {
	shim_file *p = (shim_file *)f;
	int frc = SQLITE_OK;
	if ((flags & SQLITE_SHM_UNLOCK) && p->wal) {
		frc = flush(p->wal);
	}
	if (p->keep_write && ofst == WAL_WRITE_LOCK && n == 1 && (flags & SQLITE_SHM_EXCLUSIVE)) {
		if (flags & SQLITE_SHM_UNLOCK) {
			// Kept at the system level (and in the unix VFS's books, as
			// this connection's): the next transaction takes it again
			// without two fcntl calls.
			p->write_taken = 0;
			return frc;
		}
		if (p->write_held) {
			p->write_taken = 1;
			return SQLITE_OK;
		}
		int rc = p->real->pMethods->xShmLock(p->real, ofst, n, flags);
		if (rc == SQLITE_OK) {
			p->write_held = p->write_taken = 1;
		}
		return rc;
	}
	int rc = p->real->pMethods->xShmLock(p->real, ofst, n, flags);
	return rc != SQLITE_OK ? rc : frc;
}

// release_write gives back a WAL write lock kept by shim_shm_lock and not
// taken by SQLite.
static void release_write(shim_file *p) {
	if (p->write_held && !p->write_taken) {
		p->write_held = 0;
		(void)p->real->pMethods->xShmLock(p->real, WAL_WRITE_LOCK, 1, SQLITE_SHM_UNLOCK | SQLITE_SHM_EXCLUSIVE);
	}
}

static void shim_shm_barrier(sqlite3_file *f) {
	shim_file *p = (shim_file *)f;
	if (p->wal) {
		// A failure cannot be reported from here. The buffer never holds
		// committed frames at this point: the commit frame flushed them,
		// and shim_open does not gather when SQLite pads commits (writes
		// after the commit frame).
		(void)flush(p->wal);
	}
	p->real->pMethods->xShmBarrier(p->real);
}

static int shim_shm_unmap(sqlite3_file *f, int delete_flag) {
	shim_file *p = (shim_file *)f;
	p->write_taken = 0;
	release_write(p);
	return p->real->pMethods->xShmUnmap(p->real, delete_flag);
}

static int shim_fetch(sqlite3_file *f, sqlite3_int64 off, int amt, void **pp) {
	shim_file *p = (shim_file *)f;
	int rc = flush(p);
	if (rc != SQLITE_OK) {
		return rc;
	}
	return p->real->pMethods->xFetch(p->real, off, amt, pp);
}

static int shim_unfetch(sqlite3_file *f, sqlite3_int64 off, void *ptr) {
	shim_file *p = (shim_file *)f;
	return p->real->pMethods->xUnfetch(p->real, off, ptr);
}

static const sqlite3_io_methods shim_methods = {
	3,
	shim_close,
	shim_read,
	shim_write,
	shim_truncate,
	shim_sync,
	shim_file_size,
	shim_lock,
	shim_unlock,
	shim_check_reserved,
	shim_file_control,
	shim_sector_size,
	shim_device_characteristics,
	shim_shm_map,
	shim_shm_lock,
	shim_shm_barrier,
	shim_shm_unmap,
	shim_fetch,
	shim_unfetch,
};

static int shim_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out_flags) {
	(void)vfs;
	shim_file *p = (shim_file *)f;
	memset(p, 0, sizeof(*p));
	p->real = (sqlite3_file *)(p + 1);
	int rc = real_vfs->xOpen(real_vfs, name, p->real, flags, out_flags);
	if (rc != SQLITE_OK) {
		if (p->real->pMethods) {
			p->real->pMethods->xClose(p->real);
		}
		p->base.pMethods = 0;
		return rc;
	}
	if (p->real->pMethods == 0 || p->real->pMethods->iVersion < 3) {
		// Not a file this shim knows how to forward (unix files are
		// all version 3).
		if (p->real->pMethods) {
			p->real->pMethods->xClose(p->real);
		}
		p->base.pMethods = 0;
		return SQLITE_CANTOPEN;
	}
	p->base.pMethods = &shim_methods;
	if ((flags & SQLITE_OPEN_MAIN_DB) && name) {
		p->keep_write = sqlite3_uri_boolean(name, YIRANGMQ_WRITER_PARAM, 0);
	}
	if ((flags & SQLITE_OPEN_WAL) && name) {
		sqlite3_file *db = sqlite3_database_file_object(name);
		if (db && db->pMethods == &shim_methods) {
			p->db = (shim_file *)db;
			p->db->wal = p;
			// Gather only when the database file has powersafe overwrite,
			// as SQLite's unix files do by default. Without it
			// (psow=0), sqlite3WalOpen, which asks the same question of
			// the same file right after this open, makes every commit in
			// synchronous=FULL pad the WAL to a sector boundary with
			// copies of the commit frame, syncs in the middle of the last
			// one and writes its tail after the sync: a tail that is not
			// a commit frame and that this shim would keep in its buffer
			// after the commit, up to the barrier that publishes it,
			// where a write error cannot be reported.
			const sqlite3_io_methods *m = p->db->real->pMethods;
			p->is_wal = (m->xDeviceCharacteristics(p->db->real) & SQLITE_IOCAP_POWERSAFE_OVERWRITE) != 0;
		}
		// Otherwise (a database file that is not ours) pass everything
		// through: the shim could not flush before the wal-index locks.
	}
	return SQLITE_OK;
}

static void register_vfs(void) {
	real_vfs = sqlite3_vfs_find("unix");
	if (!real_vfs || real_vfs->iVersion < 1) {
		register_rc = SQLITE_ERROR;
		return;
	}
	shim_vfs = *real_vfs;
	shim_vfs.pNext = 0;
	shim_vfs.zName = YIRANGMQ_VFS_NAME;
	shim_vfs.szOsFile = (int)((sizeof(shim_file) + 7) & ~(size_t)7) + real_vfs->szOsFile;
	shim_vfs.xOpen = shim_open;
	register_rc = sqlite3_vfs_register(&shim_vfs, 0);
}

int yirangmq_vfs_register(void) {
	pthread_once(&register_once, register_vfs);
	return register_rc;
}

// An anchor is a unix file on the database holding a SHARED lock.

struct yirangmq_anchor {
	sqlite3_file *file;
	const char *name;
};

int yirangmq_anchor_open(const char *path, yirangmq_anchor **out) {
	*out = 0;
	sqlite3_vfs *v = sqlite3_vfs_find("unix");
	if (!v) {
		return SQLITE_ERROR;
	}
	yirangmq_anchor *a = sqlite3_malloc64(sizeof(*a));
	if (!a) {
		return SQLITE_NOMEM;
	}
	a->name = sqlite3_create_filename(path, "", "", 0, 0);
	a->file = sqlite3_malloc64((unsigned long long)v->szOsFile);
	if (!a->name || !a->file) {
		sqlite3_free_filename(a->name);
		sqlite3_free(a->file);
		sqlite3_free(a);
		return SQLITE_NOMEM;
	}
	memset(a->file, 0, (size_t)v->szOsFile);
	int out_flags = 0;
	int rc = v->xOpen(v, a->name, a->file, SQLITE_OPEN_MAIN_DB | SQLITE_OPEN_READONLY, &out_flags);
	if (rc == SQLITE_OK) {
		rc = a->file->pMethods->xLock(a->file, SQLITE_LOCK_SHARED);
		if (rc != SQLITE_OK) {
			a->file->pMethods->xClose(a->file);
		}
	} else if (a->file->pMethods) {
		a->file->pMethods->xClose(a->file);
	}
	if (rc != SQLITE_OK) {
		sqlite3_free_filename(a->name);
		sqlite3_free(a->file);
		sqlite3_free(a);
		return rc;
	}
	*out = a;
	return SQLITE_OK;
}

int yirangmq_anchor_close(yirangmq_anchor *a) {
	if (!a) {
		return SQLITE_OK;
	}
	a->file->pMethods->xUnlock(a->file, SQLITE_LOCK_NONE);
	int rc = a->file->pMethods->xClose(a->file);
	sqlite3_free_filename(a->name);
	sqlite3_free(a->file);
	sqlite3_free(a);
	return rc;
}
