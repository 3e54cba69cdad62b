/*
 * mcp-sandbox-gate: a sandbox's first process, waiting at its gate (see launcher.py).
 *
 *   mcp-sandbox-gate [--fd FD] [--gid GID] [--uid UID] -- COMMAND [ARG...]
 *
 * The server runs it through the descriptor it checked (/proc/self/fd/FD, see gate.py): --fd
 * names that descriptor, closed here at the exec of COMMAND, so it never reaches the sandbox.
 *
 * It does what `sh -c GATE` and `setpriv` do for the server, in one exec of a static binary:
 *
 * 1. read from stdin (a pipe from the server) a line holding a count, then that many lines, each
 *    one more argument for COMMAND; stdin closed before all of them came (the server could not
 *    admit the process to its cgroups, or died): exit 125, running nothing;
 * 2. take /dev/null as stdin;
 * 3. with --gid: drop every supplementary group and set the real, effective and saved gid; with
 *    --uid: set the real, effective and saved uid (root's capabilities go with it); then check
 *    that all of them hold; any failure: exit 126, running nothing;
 * 4. exec COMMAND with its arguments and the completed ones (execvp, as sh's exec); failing: 127.
 *
 * Why a program of our own: sh and setpriv are two dynamically linked execs, about 1.2 ms of CPU
 * per sandbox started here, against 0.35 for this one; busybox's setpriv has no --reuid/--regid.
 * Built at setup (`make runtime`, `mcp-sandbox setup`: provision/gate.py) with the host's C
 * compiler, statically so that no dynamic loader runs; without one, sandboxes start through
 * sh and setpriv, as correctly.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GATE_CLOSED 125
#define CANNOT_DROP 126
#define CANNOT_EXEC 127
#define USAGE 2

#define MAX_INPUT (1 << 20) /* the count and the arguments, newlines included */
#define MAX_ARGUMENTS 65536

static char input[MAX_INPUT];

/* A decimal id below (unsigned)-1 (which set*id would read as "leave unchanged"), or -1. */
static long long parse_id(const char *text) {
    long long value = 0;
    if (*text == '\0' || strlen(text) > 10)
        return -1;
    for (; *text; text++) {
        if (*text < '0' || *text > '9')
            return -1;
        value = value * 10 + (*text - '0');
    }
    return value < 0xffffffffLL ? value : -1;
}

/* Read until input[0:*length] holds the count line and that many argument lines. Returns the
 * count and sets *arguments to the first argument's offset, or -1 when stdin ended before. */
static long read_lines(size_t *length, size_t *arguments) {
    long count = -1, lines = 0;
    size_t scanned = 0;
    *length = 0;
    for (;;) {
        for (; scanned < *length; scanned++) {
            if (input[scanned] != '\n')
                continue;
            if (count >= 0) {
                lines++;
                continue;
            }
            if (scanned == 0 || scanned > 5)
                return -1;
            count = 0;
            for (size_t i = 0; i < scanned; i++) {
                if (input[i] < '0' || input[i] > '9')
                    return -1;
                count = count * 10 + (input[i] - '0');
            }
            if (count > MAX_ARGUMENTS)
                return -1;
            *arguments = scanned + 1;
        }
        if (count >= 0 && lines == count)
            return count;
        if (*length == sizeof input)
            return -1;
        ssize_t got = read(STDIN_FILENO, input + *length, sizeof input - *length);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -1;
        *length += (size_t)got;
    }
}

/* Drop to gid and uid (each -1: keep ours) for good, or say why not and return -1. */
static int drop(long long gid, long long uid) {
    if (gid >= 0) {
        gid_t id = (gid_t)gid, real, effective, saved;
        if (setgroups(0, NULL) != 0 || setresgid(id, id, id) != 0) {
            perror("mcp-sandbox-gate: cannot drop to the sandbox's gid");
            return -1;
        }
        if (getresgid(&real, &effective, &saved) != 0 || real != id || effective != id || saved != id ||
            getgroups(0, NULL) != 0) {
            fputs("mcp-sandbox-gate: the sandbox's gid did not hold\n", stderr);
            return -1;
        }
    }
    if (uid >= 0) {
        uid_t id = (uid_t)uid, real, effective, saved;
        if (setresuid(id, id, id) != 0) {
            perror("mcp-sandbox-gate: cannot drop to the sandbox's uid");
            return -1;
        }
        if (getresuid(&real, &effective, &saved) != 0 || real != id || effective != id || saved != id) {
            fputs("mcp-sandbox-gate: the sandbox's uid did not hold\n", stderr);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    long long gid = -1, uid = -1, self = -1;
    int first = 1;
    for (; first < argc && strcmp(argv[first], "--") != 0; first += 2) {
        long long *id = strcmp(argv[first], "--gid") == 0   ? &gid
                        : strcmp(argv[first], "--uid") == 0 ? &uid
                        : strcmp(argv[first], "--fd") == 0  ? &self
                                                            : NULL;
        if (id == NULL || first + 1 >= argc || (*id = parse_id(argv[first + 1])) < 0 ||
            (id == &self && (self > 0x7fffffffLL || fcntl((int)self, F_SETFD, FD_CLOEXEC) != 0))) {
            fprintf(stderr, "mcp-sandbox-gate: bad option %s (usage: [--fd FD] [--gid GID] [--uid UID] -- COMMAND...)\n",
                    argv[first]);
            return USAGE;
        }
    }
    /* Run as /proc/self/fd/FD, the kernel named the process FD: give it its own name for ps. */
    prctl(PR_SET_NAME, "mcp-sandbox-gate", 0, 0, 0);
    first++; /* past "--" */
    if (first >= argc) {
        fputs("mcp-sandbox-gate: no command (usage: [--fd FD] [--gid GID] [--uid UID] -- COMMAND...)\n", stderr);
        return USAGE;
    }

    size_t length = 0, offset = 0;
    long count = read_lines(&length, &offset);
    if (count < 0)
        return GATE_CLOSED;
    size_t fixed = (size_t)(argc - first);
    char **command = calloc(fixed + (size_t)count + 1, sizeof *command);
    if (command == NULL)
        return GATE_CLOSED;
    memcpy(command, argv + first, fixed * sizeof *command);
    for (long i = 0; i < count; i++) {
        char *end = memchr(input + offset, '\n', length - offset); /* read_lines counted it */
        *end = '\0';
        command[fixed + (size_t)i] = input + offset;
        offset = (size_t)(end - input) + 1;
    }

    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null < 0 || dup2(null, STDIN_FILENO) < 0) {
        perror("mcp-sandbox-gate: /dev/null");
        return CANNOT_DROP;
    }
    close(null);
    if (drop(gid, uid) != 0)
        return CANNOT_DROP;
    execvp(command[0], command);
    fprintf(stderr, "mcp-sandbox-gate: %s: %s\n", command[0], strerror(errno));
    return CANNOT_EXEC;
}
