/* A legacy C client of a yirangmq mount: plain POSIX calls, no library.
 * Each command prints "call=errno-name" for the calls that matter, so a
 * test can check the errno of every step.
 *
 *   client publish PATH DATA        open(O_CREAT|O_EXCL|O_WRONLY), write, close
 *   client publish-big PATH BYTES   the same with BYTES bytes, written 4 KiB at a time
 *   client thread-close PATH DATA   create and write, close(2) on another thread
 *   client fork-write PATH          write "a", a child writes "b" and exits, then "c"
 *   client next PATH SECONDS        read .next with alarm(SECONDS) and no SA_RESTART
 *   client next-nonblock PATH       read .next with O_NONBLOCK
 *   client write-policy PATH DATA   open(O_WRONLY|O_TRUNC), write, close
 *   client rename FROM TO           rename(2)
 *   client stat32 PATH              stat(2) and whether st_ino fits in 32 bits
 *   client setxattr PATH NAME VALUE setxattr(2)
 *   client getxattr PATH NAME       getxattr(2), and the value
 *   client publish-hold PATH DATA   create and write, print "held", wait for a
 *                                   line on stdin, then close: a test can act on
 *                                   the file while it is still open for writing
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *ename(int e) {
	switch (e) {
	case 0: return "OK";
	case EPERM: return "EPERM";
	case ENOENT: return "ENOENT";
	case EINTR: return "EINTR";
	case EIO: return "EIO";
	case EAGAIN: return "EAGAIN";
	case EACCES: return "EACCES";
	case EBUSY: return "EBUSY";
	case EEXIST: return "EEXIST";
	case EINVAL: return "EINVAL";
	case EFBIG: return "EFBIG";
	case ENOSPC: return "ENOSPC";
	case ENOTEMPTY: return "ENOTEMPTY";
	case EDQUOT: return "EDQUOT";
	case ENAMETOOLONG: return "ENAMETOOLONG";
	case ENOTSUP: return "ENOTSUP";
	case ENODATA: return "ENODATA";
	case ERANGE: return "ERANGE";
	case ENOTDIR: return "ENOTDIR";
	case EISDIR: return "EISDIR";
	case EXDEV: return "EXDEV";
	}
	static char buf[32];
	snprintf(buf, sizeof buf, "E%d", e);
	return buf;
}

static int report(const char *call, int rc) {
	printf("%s=%s\n", call, rc < 0 ? ename(errno) : "OK");
	fflush(stdout);
	return rc;
}

static int fd_to_close;
static void *closer(void *arg) {
	(void)arg;
	report("close", close(fd_to_close));
	return NULL;
}

static void on_alarm(int sig) { (void)sig; }

int main(int argc, char **argv) {
	if (argc < 3) {
		fprintf(stderr, "usage: client COMMAND PATH [ARG]\n");
		return 2;
	}
	const char *cmd = argv[1], *path = argv[2], *arg = argc > 3 ? argv[3] : "";

	if (!strcmp(cmd, "publish") || !strcmp(cmd, "thread-close")) {
		int fd = report("open", open(path, O_CREAT | O_EXCL | O_WRONLY, 0644));
		if (fd < 0) return 1;
		report("write", write(fd, arg, strlen(arg)));
		if (!strcmp(cmd, "publish")) {
			report("close", close(fd));
		} else {
			pthread_t t;
			fd_to_close = fd;
			pthread_create(&t, NULL, closer, NULL);
			pthread_join(t, NULL);
		}
		return 0;
	}
	if (!strcmp(cmd, "publish-big")) {
		long n = atol(arg);
		char buf[4096];
		memset(buf, 'x', sizeof buf);
		int fd = report("open", open(path, O_CREAT | O_EXCL | O_WRONLY, 0644));
		if (fd < 0) return 1;
		int werr = 0;
		for (long done = 0; done < n;) {
			long k = n - done < (long)sizeof buf ? n - done : (long)sizeof buf;
			ssize_t w = write(fd, buf, k);
			if (w < 0) { werr = errno; break; }
			done += w;
		}
		printf("write=%s\n", ename(werr));
		report("close", close(fd));
		return 0;
	}
	if (!strcmp(cmd, "fork-write")) {
		int fd = report("open", open(path, O_CREAT | O_EXCL | O_WRONLY, 0644));
		if (fd < 0) return 1;
		report("write", write(fd, "a", 1));
		pid_t pid = fork();
		if (pid == 0) {
			if (write(fd, "b", 1) != 1) _exit(1);
			_exit(0); /* the child's exit flushes the inherited descriptor */
		}
		int st;
		waitpid(pid, &st, 0);
		report("write", write(fd, "c", 1));
		report("close", close(fd));
		return 0;
	}
	if (!strcmp(cmd, "next") || !strcmp(cmd, "next-nonblock")) {
		struct sigaction sa;
		memset(&sa, 0, sizeof sa);
		sa.sa_handler = on_alarm; /* no SA_RESTART: the read must return EINTR */
		sigaction(SIGALRM, &sa, NULL);
		int flags = O_RDONLY;
		if (!strcmp(cmd, "next-nonblock")) flags |= O_NONBLOCK;
		int fd = report("open", open(path, flags));
		if (fd < 0) return 1;
		if (*arg) alarm(atoi(arg));
		char buf[512];
		ssize_t n = read(fd, buf, sizeof buf - 1);
		report("read", n);
		if (n > 0) {
			buf[n] = 0;
			printf("data=%s", buf);
		}
		close(fd);
		return 0;
	}
	if (!strcmp(cmd, "write-policy")) {
		int fd = report("open", open(path, O_WRONLY | O_TRUNC));
		if (fd < 0) return 1;
		report("write", write(fd, arg, strlen(arg)));
		report("close", close(fd));
		return 0;
	}
	if (!strcmp(cmd, "rename")) {
		report("rename", rename(path, arg));
		return 0;
	}
	if (!strcmp(cmd, "stat32")) {
		struct stat st;
		if (report("stat", stat(path, &st)) < 0) return 1;
		printf("ino=%llu fits32=%d\n", (unsigned long long)st.st_ino, st.st_ino <= 0xffffffffULL);
		return 0;
	}
	if (!strcmp(cmd, "setxattr")) {
		if (argc < 5) { fprintf(stderr, "usage: client setxattr PATH NAME VALUE\n"); return 2; }
		report("setxattr", setxattr(path, arg, argv[4], strlen(argv[4]), 0));
		return 0;
	}
	if (!strcmp(cmd, "getxattr")) {
		char val[1024];
		ssize_t n = getxattr(path, arg, val, sizeof val - 1);
		report("getxattr", n);
		if (n >= 0) {
			val[n] = 0;
			printf("value=%s\n", val);
		}
		return 0;
	}
	if (!strcmp(cmd, "publish-hold")) {
		int fd = report("open", open(path, O_CREAT | O_EXCL | O_WRONLY, 0644));
		if (fd < 0) return 1;
		report("write", write(fd, arg, strlen(arg)));
		printf("held\n");
		fflush(stdout);
		char line[64];
		if (!fgets(line, sizeof line, stdin)) { /* EOF: close all the same */ }
		report("close", close(fd));
		return 0;
	}
	fprintf(stderr, "unknown command %s\n", cmd);
	return 2;
}
