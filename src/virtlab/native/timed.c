/*
 * timed: runs a command where it is measured and reports what it cost there: its wall time (the
 * monotonic clock around fork and wait, inside the environment: in a VM the guest's clock, not the
 * round trip of the agent that started it) and the user and system time of its process tree (the
 * rusage wait4 returns: the command and every descendant it waited for).
 *
 * Usage: timed [-C DIR] [-e NAME=VALUE]... [-w ADDRESS:PORT [-W SECONDS]] -- COMMAND [ARG]...
 *   -C DIR            run the command in DIR
 *   -e NAME=VALUE     set a variable in the command's environment (repeatable)
 *   -w ADDRESS:PORT   before the clock starts, wait until a TCP connection to ADDRESS:PORT succeeds
 *                     (a server started beside the command); -W bounds the wait (default 30 s)
 *
 * The command's output is its own: it writes to timed's stdout and stderr directly. When it has
 * ended, timed writes one line to stdout, after a newline so that it is a line of its own:
 *   virtlab-timed: exit=N signal=S elapsed_s=T user_s=U sys_s=S maxrss_kb=K
 * and exits with the command's status (128 + the signal's number when a signal ended it; 127 when
 * it could not be started, 124 when the server never accepted).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_VARIABLES 256

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int usage(const char *self)
{
    fprintf(stderr, "usage: %s [-C DIR] [-e NAME=VALUE]... [-w ADDRESS:PORT [-W SECONDS]] -- COMMAND [ARG]...\n",
            self);
    return 2;
}

/* Whether one TCP connection to host:port succeeds now. */
static int accepts(const char *host, const char *port)
{
    struct addrinfo hints = {0}, *found = NULL;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &found) != 0)
        return 0;
    int ok = 0;
    for (struct addrinfo *a = found; a != NULL && !ok; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        ok = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
        close(fd);
    }
    freeaddrinfo(found);
    return ok;
}

static int wait_for(const char *target, double limit_s)
{
    char host[256];
    const char *colon = strrchr(target, ':');
    if (colon == NULL || colon == target || (size_t)(colon - target) >= sizeof host) {
        fprintf(stderr, "timed: -w wants ADDRESS:PORT, not %s\n", target);
        return 2;
    }
    memcpy(host, target, colon - target);
    host[colon - target] = '\0';
    double until = now_s() + limit_s;
    while (!accepts(host, colon + 1)) {
        if (now_s() > until) {
            fprintf(stderr, "timed: nothing accepted a connection on %s within %g s\n", target, limit_s);
            return 124;
        }
        struct timespec pause = {0, 50 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *server = NULL;
    char *variables[MAX_VARIABLES];
    int nvariables = 0, opt;
    double wait_s = 30.0;
    while ((opt = getopt(argc, argv, "+C:e:w:W:")) != -1) {
        switch (opt) {
        case 'C':
            dir = optarg;
            break;
        case 'e':
            if (nvariables == MAX_VARIABLES || strchr(optarg, '=') == NULL || optarg[0] == '=') {
                fprintf(stderr, "timed: -e wants NAME=VALUE (at most %d), not %s\n", MAX_VARIABLES, optarg);
                return 2;
            }
            variables[nvariables++] = optarg;
            break;
        case 'w':
            server = optarg;
            break;
        case 'W':
            wait_s = atof(optarg);
            break;
        default:
            return usage(argv[0]);
        }
    }
    if (optind >= argc)
        return usage(argv[0]);
    if (server != NULL) {
        int waited = wait_for(server, wait_s);
        if (waited != 0)
            return waited;
    }
    fflush(stdout);
    double started = now_s();
    pid_t child = fork();
    if (child < 0) {
        perror("timed: fork");
        return 127;
    }
    if (child == 0) {
        if (dir != NULL && chdir(dir) != 0) {
            fprintf(stderr, "timed: cannot enter %s: %s\n", dir, strerror(errno));
            _exit(127);
        }
        for (int i = 0; i < nvariables; i++) {
            char *eq = strchr(variables[i], '=');
            *eq = '\0';
            setenv(variables[i], eq + 1, 1);
        }
        execvp(argv[optind], argv + optind);
        fprintf(stderr, "timed: cannot run %s: %s\n", argv[optind], strerror(errno));
        _exit(127);
    }
    /* The command, not timed, is what a terminal's Ctrl-C or the runner's SIGTERM is for. */
    signal(SIGINT, SIG_IGN);
    int status;
    struct rusage usage;
    while (wait4(child, &status, 0, &usage) < 0) {
        if (errno != EINTR) {
            perror("timed: wait4");
            return 127;
        }
    }
    double elapsed = now_s() - started;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    printf("\nvirtlab-timed: exit=%d signal=%d elapsed_s=%.9f user_s=%.6f sys_s=%.6f maxrss_kb=%ld\n", code, sig,
           elapsed, usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6,
           usage.ru_stime.tv_sec + usage.ru_stime.tv_usec / 1e6, usage.ru_maxrss);
    fflush(stdout);
    return code;
}
