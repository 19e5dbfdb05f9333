/*
 * escape-probe: attacks a crucible namespace sandbox from inside, one system call at a time.
 *
 * Built static by tests/build.rs and uploaded into a sandbox by tests/tests/namespace_escape.rs,
 * which runs `escape-probe NAME...` and checks each verdict. One line per attempt:
 *
 *     NAME OK            the call succeeded
 *     NAME ERRNO_NAME    it failed with that errno (EPERM, ENOSYS, ...)
 *
 * The attempts are chosen so that success changes nothing on the host either way: every call
 * is made with arguments that are harmless if it went through (an empty keyring name, a
 * zero-length module, a bad kexec segment list, ...); the test asserts the refusal.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/perf_event.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif
#ifndef AF_ALG
#define AF_ALG 38
#endif

static const char *errno_name(int e) {
    switch (e) {
    case EPERM: return "EPERM";
    case ENOSYS: return "ENOSYS";
    case EACCES: return "EACCES";
    case EINVAL: return "EINVAL";
    case ESRCH: return "ESRCH";
    case ENOENT: return "ENOENT";
    case EBADF: return "EBADF";
    case EFAULT: return "EFAULT";
    case EROFS: return "EROFS";
    case ENOTDIR: return "ENOTDIR";
    case EAFNOSUPPORT: return "EAFNOSUPPORT";
    case ENOEXEC: return "ENOEXEC";
    case EBUSY: return "EBUSY";
    case ENOTSUP: return "ENOTSUP";
    default: return "EOTHER";
    }
}

static void report(const char *name, long ret) {
    if (ret < 0)
        printf("%s %s\n", name, errno_name(errno));
    else
        printf("%s OK\n", name);
    fflush(stdout);
}

/* A child that waits to be traced, to show ptrace works on the workload's own processes. */
static long ptrace_own_child(void) {
    pid_t child = fork();
    if (child == 0) {
        pause();
        _exit(0);
    }
    long ret = ptrace(PTRACE_ATTACH, child, 0, 0);
    int saved = errno;
    if (ret == 0) {
        waitpid(child, NULL, 0);
        ptrace(PTRACE_DETACH, child, 0, 0);
    }
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    errno = saved;
    return ret;
}

static long clone_with(unsigned long flags) {
    long pid = syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
    if (pid == 0)
        _exit(0);
    if (pid > 0)
        waitpid((pid_t)pid, NULL, 0);
    return pid;
}

static long attempt(const char *name) {
    char byte;
    /* openw:PATH opens PATH for writing and closes it without writing: a permission check
     * that changes nothing, even on a sysctl. */
    if (!strncmp(name, "openw:", 6)) {
        long fd = open(name + 6, O_WRONLY | O_CLOEXEC);
        if (fd >= 0) close((int)fd);
        return fd;
    }
    struct iovec local = {&byte, 1}, remote = {(void *)0x400000, 1};
    /* The same attacks on another process than the agent: ptrace:PID, vm-read:PID,
     * setns-mnt:PID, pidfd-getfd:PID:FD, and open:PATH (read-only, closed at once). */
    if (!strncmp(name, "open:", 5)) {
        long fd = open(name + 5, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) close((int)fd);
        return fd;
    }
    if (!strncmp(name, "ptrace:", 7)) return ptrace(PTRACE_ATTACH, atoi(name + 7), 0, 0);
    if (!strncmp(name, "vm-read:", 8))
        return process_vm_readv(atoi(name + 8), &local, 1, &remote, 1, 0);
    if (!strncmp(name, "setns-mnt:", 10)) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/ns/mnt", atoi(name + 10));
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return fd;
        return setns(fd, CLONE_NEWNS);
    }
    if (!strncmp(name, "pidfd-getfd:", 12)) {
        int pid = atoi(name + 12);
        const char *fd = strchr(name + 12, ':');
        long pidfd = syscall(SYS_pidfd_open, pid, 0);
        if (pidfd < 0) return pidfd;
        return syscall(SYS_pidfd_getfd, pidfd, fd ? atoi(fd + 1) : 0, 0);
    }
    if (!strcmp(name, "ptrace-agent")) return ptrace(PTRACE_ATTACH, 1, 0, 0);
    if (!strcmp(name, "ptrace-seize-agent")) return ptrace(PTRACE_SEIZE, 1, 0, 0);
    if (!strcmp(name, "ptrace-own-child")) return ptrace_own_child();
    if (!strcmp(name, "vm-read-agent")) return process_vm_readv(1, &local, 1, &remote, 1, 0);
    if (!strcmp(name, "vm-write-agent")) return process_vm_writev(1, &local, 1, &remote, 1, 0);
    if (!strcmp(name, "agent-mem")) return open("/proc/1/mem", O_RDONLY);
    if (!strcmp(name, "agent-fd")) return open("/proc/1/fd/3", O_RDONLY);
    if (!strcmp(name, "pidfd-getfd-agent")) {
        long pidfd = syscall(SYS_pidfd_open, 1, 0);
        if (pidfd < 0) return pidfd;
        return syscall(SYS_pidfd_getfd, pidfd, 3, 0);
    }
    if (!strcmp(name, "kill-agent")) return kill(1, SIGKILL);
    if (!strcmp(name, "keyctl")) return syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -3, 0);
    if (!strcmp(name, "add-key")) return syscall(SYS_add_key, "user", "crucible-probe", "x", 1, -3);
    if (!strcmp(name, "request-key")) return syscall(SYS_request_key, "user", "crucible-probe", 0, 0);
    if (!strcmp(name, "bpf")) {
        union bpf_attr attr;
        memset(&attr, 0, sizeof attr);
        attr.map_type = BPF_MAP_TYPE_ARRAY;
        attr.key_size = 4;
        attr.value_size = 4;
        attr.max_entries = 1;
        return syscall(SYS_bpf, BPF_MAP_CREATE, &attr, sizeof attr);
    }
    if (!strcmp(name, "perf-event-open")) {
        struct perf_event_attr attr;
        memset(&attr, 0, sizeof attr);
        attr.size = sizeof attr;
        attr.type = PERF_TYPE_SOFTWARE;
        attr.config = PERF_COUNT_SW_TASK_CLOCK;
        return syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0);
    }
    if (!strcmp(name, "userfaultfd")) return syscall(SYS_userfaultfd, 0);
    if (!strcmp(name, "io-uring-setup")) {
        char params[120];
        memset(params, 0, sizeof params);
        return syscall(425 /* io_uring_setup */, 1, params);
    }
    if (!strcmp(name, "clone-newuser")) return clone_with(CLONE_NEWUSER);
    if (!strcmp(name, "clone-newns")) return clone_with(CLONE_NEWNS);
    if (!strcmp(name, "clone-newnet")) return clone_with(CLONE_NEWNET);
    if (!strcmp(name, "clone-newpid")) return clone_with(CLONE_NEWPID);
    if (!strcmp(name, "clone-plain")) return clone_with(0);
    if (!strcmp(name, "clone3")) {
        uint64_t args[11];
        memset(args, 0, sizeof args);
        args[4] = SIGCHLD; /* exit_signal */
        long pid = syscall(435 /* clone3 */, args, sizeof args);
        if (pid == 0) _exit(0);
        if (pid > 0) waitpid((pid_t)pid, NULL, 0);
        return pid;
    }
    if (!strcmp(name, "unshare-user")) return unshare(CLONE_NEWUSER);
    if (!strcmp(name, "unshare-mount")) return unshare(CLONE_NEWNS);
    if (!strcmp(name, "setns")) {
        int fd = open("/proc/self/ns/net", O_RDONLY);
        if (fd < 0) return fd;
        return setns(fd, 0);
    }
    if (!strcmp(name, "mount")) return mount("none", "/mnt", "tmpfs", 0, NULL);
    if (!strcmp(name, "umount")) return umount2("/proc", MNT_DETACH);
    if (!strcmp(name, "pivot-root")) return syscall(SYS_pivot_root, "/", "/");
    if (!strcmp(name, "fsopen")) return syscall(430 /* fsopen */, "tmpfs", 0);
    if (!strcmp(name, "open-tree")) return syscall(428 /* open_tree */, AT_FDCWD, "/", 1);
    if (!strcmp(name, "open-by-handle-at")) {
        char handle[16] = {8, 0, 0, 0, 1, 0, 0, 0};
        return syscall(SYS_open_by_handle_at, AT_FDCWD, handle, O_RDONLY);
    }
    if (!strcmp(name, "kexec-load")) return syscall(SYS_kexec_load, 0, 0, NULL, 0);
    if (!strcmp(name, "init-module")) return syscall(SYS_init_module, "", 0, "");
    if (!strcmp(name, "finit-module")) return syscall(SYS_finit_module, -1, "", 0);
    if (!strcmp(name, "delete-module")) return syscall(SYS_delete_module, "crucible_probe_none", 0);
    if (!strcmp(name, "swapon")) return syscall(SYS_swapon, "/crucible-probe-none", 0);
    if (!strcmp(name, "settimeofday")) {
        struct timeval now;
        gettimeofday(&now, NULL);
        return settimeofday(&now, NULL);
    }
    if (!strcmp(name, "clock-settime")) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        return clock_settime(CLOCK_REALTIME, &now);
    }
    if (!strcmp(name, "acct")) return syscall(SYS_acct, NULL);
    if (!strcmp(name, "quotactl")) return syscall(SYS_quotactl, 0, "/", 0, NULL);
    if (!strcmp(name, "reboot")) return syscall(SYS_reboot, 0, 0, 0, NULL); /* bad magic */
    if (!strcmp(name, "sethostname")) return sethostname("evil", 4);
    if (!strcmp(name, "iopl")) return syscall(SYS_iopl, 3);
    if (!strcmp(name, "syslog")) return syscall(SYS_syslog, 10 /* SYSLOG_ACTION_SIZE_BUFFER */, 0, 0);
    if (!strcmp(name, "personality-read-implies-exec")) return personality(READ_IMPLIES_EXEC);
    if (!strcmp(name, "personality-query")) return personality(0xffffffff);
    if (!strcmp(name, "personality-linux32")) {
        int old = personality(PER_LINUX32);
        if (old == -1) return -1;
        return personality(old) == -1 ? -1 : 0;
    }
    if (!strcmp(name, "socket-vsock")) return socket(AF_VSOCK, SOCK_STREAM, 0);
    if (!strcmp(name, "socket-alg")) return socket(AF_ALG, SOCK_SEQPACKET, 0);
    if (!strcmp(name, "socket-unix")) return socket(AF_UNIX, SOCK_STREAM, 0);
    if (!strcmp(name, "socket-packet")) return socket(AF_PACKET, SOCK_RAW, 0);
    if (!strcmp(name, "socket-netfilter")) return socket(AF_NETLINK, SOCK_RAW, 12 /* NETLINK_NETFILTER */);
    if (!strcmp(name, "socket-rtnetlink")) return socket(AF_NETLINK, SOCK_RAW, 0 /* NETLINK_ROUTE */);
    if (!strcmp(name, "unknown-syscall")) return syscall(1000);
    /* Run setuid root by another user: did the exec make us root? */
    if (!strcmp(name, "euid-root")) {
        if (geteuid() == 0) return 0;
        errno = EPERM;
        return -1;
    }
    if (!strcmp(name, "x32-syscall")) return syscall(0x40000000 | 39 /* getpid */);
    errno = EINVAL;
    fprintf(stderr, "escape-probe: unknown attempt %s\n", name);
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: escape-probe NAME...\n");
        return 2;
    }
    for (int i = 1; i < argc; i++)
        report(argv[i], attempt(argv[i]));
    return 0;
}
