package sqlite

/*
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

typedef long long yirangmq_i64;
int sqlite3_status64(int op, yirangmq_i64 *pCurrent, yirangmq_i64 *pHighwater, int resetFlag);

// SQLITE_STATUS_MEMORY_USED: the bytes SQLite has from malloc, all
// connections of the process together.
static long long yirangmq_sqlite_memory_used(void) {
	yirangmq_i64 cur = 0, high = 0;
	if (sqlite3_status64(0, &cur, &high, 0) != 0) {
		return -1;
	}
	return cur;
}

// glibc keeps what SQLite frees in its arenas, one per thread that called
// malloc, and returns to the kernel only the top of each; malloc_trim
// gives back every whole free page of every arena.
static void yirangmq_trim_heap(void) {
#ifdef __GLIBC__
	malloc_trim(0);
#endif
}
*/
import "C"

// sqliteMemoryUsed returns the bytes SQLite holds from the C allocator, for
// all the stores of the process, or -1.
func sqliteMemoryUsed() int64 { return int64(C.yirangmq_sqlite_memory_used()) }

// trimCHeap gives the C allocator's free pages back to the kernel (glibc;
// nothing elsewhere).
func trimCHeap() { C.yirangmq_trim_heap() }
