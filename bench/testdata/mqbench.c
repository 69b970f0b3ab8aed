/*
 * mqbench: POSIX message queues (mq_send/mq_receive), the in-kernel,
 * non-durable floor of `mountbench suite`. Built by the suite with
 *
 *	gcc -O2 -o mqbench mqbench.c -lrt -lpthread
 *
 * Usage:
 *	mqbench ops N CLIENTS   publish (mq_send), lease (mq_receive) and
 *	                        round trip (send then receive), N of each,
 *	                        split over CLIENTS threads, each with a
 *	                        queue of its own.
 *	mqbench wake N          N wake-ups of a thread blocked in mq_receive:
 *	                        from before mq_send to the receiver's return.
 *
 * Prints one JSON object per line: first {"room": R}, the messages a
 * queue holds, then per phase op, clients, ops, seconds, p50_us, p99_us,
 * cpu_s (user+system of the process). When a queue holds fewer than N,
 * publishes alternate with untimed receives in runs of R (leases with
 * untimed sends), and seconds and cpu_s are the phase's scaled by the
 * share of the threads' time spent in the timed operation.
 * Messages are 256 bytes; there is no ack (a received message is gone).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <mqueue.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MSG 256

static char qname[64];

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static void die(const char *what)
{
	perror(what);
	exit(1); /* the queues were unlinked when opened */
}

static int cmp64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

static double pct(int64_t *v, long n, double p)
{
	long i = (long)(p * n + 0.999999) - 1;
	if (i < 0)
		i = 0;
	if (i >= n)
		i = n - 1;
	return v[i] / 1e3;
}

static void report(const char *op, int clients, long n, int64_t wall, int64_t *lat, double cpu)
{
	qsort(lat, n, sizeof lat[0], cmp64);
	printf("{\"op\":\"%s\",\"clients\":%d,\"ops\":%ld,\"seconds\":%.6f,\"p50_us\":%.2f,\"p99_us\":%.2f,\"cpu_s\":%.6f}\n",
	       op, clients, n, wall / 1e9, pct(lat, n, 0.50), pct(lat, n, 0.99), cpu);
	fflush(stdout);
}

/*
 * open_queue opens a new queue named qname-SUFFIX with room for *want
 * messages, or as many as the kernel gives (fs.mqueue.msg_max, 10 by
 * default, without CAP_SYS_RESOURCE), and says how many in *want.
 */
static mqd_t open_queue(const char *suffix, long *want, char *name, size_t size)
{
	struct rlimit rl = {RLIM_INFINITY, RLIM_INFINITY};
	setrlimit(RLIMIT_MSGQUEUE, &rl); /* allowed with CAP_SYS_RESOURCE only */
	snprintf(name, size, "%s-%s", qname, suffix);
	long max = *want;
	for (;;) {
		struct mq_attr a = {.mq_maxmsg = max, .mq_msgsize = MSG};
		mqd_t q = mq_open(name, O_RDWR | O_CREAT | O_EXCL, 0600, &a);
		if (q != (mqd_t)-1) {
			mq_unlink(name); /* gone when we close it or exit */
			*want = max;
			return q;
		}
		if ((errno != EINVAL && errno != EMFILE && errno != ENOMEM && errno != EPERM) || max == 1)
			die("mq_open");
		max = max > 10 ? (max / 2 > 10 ? max / 2 : 10) : max - 1;
	}
}

/*
 * A client has a queue of its own. The queue holds only room messages, so
 * a publish run sends room messages (timed) and then takes them back
 * (untimed), a lease run the other way round; a round trip is timed whole.
 */
struct job {
	mqd_t q;
	long room;
	int op; /* 0 publish, 1 lease, 2 round trip */
	long n;
	int64_t *lat;
	int64_t timed, busy;
	pthread_barrier_t *start;
};

static void *worker(void *arg)
{
	struct job *j = arg;
	char buf[MSG];
	memset(buf, 'a', sizeof buf);
	pthread_barrier_wait(j->start);
	int64_t b0 = now_ns();
	for (long i = 0; i < j->n;) {
		long k = j->op == 2 ? 1 : (j->n - i < j->room ? j->n - i : j->room);
		if (j->op == 1)
			for (long x = 0; x < k; x++)
				if (mq_send(j->q, buf, MSG, 0) != 0)
					die("mq_send");
		for (long x = 0; x < k; x++, i++) {
			int64_t t0 = now_ns();
			if (j->op != 1 && mq_send(j->q, buf, MSG, 0) != 0)
				die("mq_send");
			if (j->op != 0 && mq_receive(j->q, buf, MSG, NULL) != MSG)
				die("mq_receive");
			j->lat[i] = now_ns() - t0;
			j->timed += j->lat[i];
		}
		if (j->op == 0)
			for (long x = 0; x < k; x++)
				if (mq_receive(j->q, buf, MSG, NULL) != MSG)
					die("mq_receive");
	}
	j->busy = now_ns() - b0;
	return NULL;
}

static void phase(struct job *jobs, const char *name, int op, long n, int clients)
{
	pthread_t th[256];
	pthread_barrier_t start;
	int64_t *lat = calloc(n, sizeof *lat);
	if (!lat)
		die("calloc");
	pthread_barrier_init(&start, NULL, clients + 1);
	long off = 0;
	for (int c = 0; c < clients; c++) {
		long k = n / clients + (c < n % clients);
		jobs[c].op = op;
		jobs[c].n = k;
		jobs[c].lat = lat + off;
		jobs[c].timed = jobs[c].busy = 0;
		jobs[c].start = &start;
		off += k;
		if (pthread_create(&th[c], NULL, worker, &jobs[c]) != 0)
			die("pthread_create");
	}
	double c0 = cpu_s();
	int64_t t0 = now_ns();
	pthread_barrier_wait(&start);
	for (int c = 0; c < clients; c++)
		pthread_join(th[c], NULL);
	int64_t wall = now_ns() - t0;
	double cpu = cpu_s() - c0;
	/* The share of the run spent in the timed operation. */
	int64_t timed = 0, busy = 0;
	for (int c = 0; c < clients; c++) {
		timed += jobs[c].timed;
		busy += jobs[c].busy;
	}
	double share = busy > 0 ? (double)timed / busy : 1;
	report(name, clients, n, (int64_t)(wall * share), lat, cpu * share);
	pthread_barrier_destroy(&start);
	free(lat);
}

struct waker {
	mqd_t q, back;
	long n;
	int64_t *lat;
};

static void *receiver(void *arg)
{
	struct waker *w = arg;
	char buf[MSG];
	for (long i = 0; i < w->n; i++) {
		if (mq_receive(w->q, buf, MSG, NULL) != MSG)
			die("mq_receive");
		int64_t sent;
		memcpy(&sent, buf, sizeof sent);
		w->lat[i] = now_ns() - sent;
		if (mq_send(w->back, buf, 1, 0) != 0)
			die("mq_send back");
	}
	return NULL;
}

static void wake(long n)
{
	long room = 1;
	char name[96];
	mqd_t q = open_queue("wake", &room, name, sizeof name);
	room = 1;
	mqd_t back = open_queue("back", &room, name, sizeof name);
	struct waker w = {q, back, n, calloc(n, sizeof(int64_t))};
	pthread_t th;
	if (pthread_create(&th, NULL, receiver, &w) != 0)
		die("pthread_create");
	char buf[MSG];
	memset(buf, 'a', sizeof buf);
	double c0 = cpu_s();
	int64_t t0 = now_ns();
	for (long i = 0; i < n; i++) {
		/* Let the receiver block in mq_receive again. */
		struct timespec pause = {0, 200000};
		nanosleep(&pause, NULL);
		int64_t t = now_ns();
		memcpy(buf, &t, sizeof t);
		if (mq_send(q, buf, MSG, 0) != 0)
			die("mq_send");
		if (mq_receive(back, buf, MSG, NULL) < 0)
			die("mq_receive back");
	}
	int64_t wall = now_ns() - t0;
	pthread_join(th, NULL);
	report("wake", 1, n, wall, w.lat, cpu_s() - c0);
	mq_close(back);
	mq_close(q);
}

int main(int argc, char **argv)
{
	snprintf(qname, sizeof qname, "/yirangmq-mqbench-%d", (int)getpid());
	if (argc == 3 && strcmp(argv[1], "wake") == 0) {
		wake(atol(argv[2]));
		return 0;
	}
	if (argc != 4 || strcmp(argv[1], "ops") != 0) {
		fprintf(stderr, "usage: mqbench ops N CLIENTS | mqbench wake N\n");
		return 2;
	}
	long n = atol(argv[2]);
	int clients = atoi(argv[3]);
	if (n < 1 || clients < 1 || clients > 256) {
		fprintf(stderr, "mqbench: bad N or CLIENTS\n");
		return 2;
	}
	static struct job jobs[256];
	for (int c = 0; c < clients; c++) {
		char suffix[16], name[96];
		snprintf(suffix, sizeof suffix, "c%d", c);
		jobs[c].room = n;
		jobs[c].q = open_queue(suffix, &jobs[c].room, name, sizeof name);
	}
	printf("{\"room\":%ld}\n", jobs[0].room);
	phase(jobs, "publish", 0, n, clients);
	phase(jobs, "lease", 1, n, clients);
	phase(jobs, "roundtrip", 2, n, clients);
	for (int c = 0; c < clients; c++)
		mq_close(jobs[c].q);
	return 0;
}
