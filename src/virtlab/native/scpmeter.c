/*
 * scpmeter: one scp transfer, timed from the sending side, with scp's own progress meter kept
 * (seed 000 chapter 8 read the rate at 50% of the transfer from that meter).
 *
 * scp draws its meter only on a terminal (stdout a tty, scp in its foreground process group), so
 * scp runs here on a pseudo-terminal (forkpty) METER_COLUMNS wide. Everything it writes there is
 * read as it comes, split at '\r' and '\n' (the meter redraws its line with '\r'), and printed as
 * records stamped with the time they arrived. Which records are meter lines, and what they say,
 * is for the parser (virtlab.workloads.scp) to decide: this kernel only times and relays.
 *
 * Usage: scpmeter -s SIZE_MB -f SOURCE [-c CIPHER] -- scp ARG...
 *   -s MB      size of SOURCE in MiB; SOURCE is written first when it is missing or of another size,
 *              with incompressible bytes (xorshift64*), outside the timing
 *   -f PATH    the file scp sends (one of the scp arguments)
 *   -c CIPHER  first ask `ssh -Q cipher` whether this OpenSSH offers CIPHER; when it does not,
 *              say so (offered=0) and exit 3 without running scp
 *
 * Output, one key=value per line (a value runs to the end of its line):
 *   openssh=OpenSSH_9.2p1 Debian-2+deb12u10, OpenSSL 3.0.19 27 Jan 2026    (ssh -V)
 *   offered=1                   (with -c; offered=0 adds ciphers=<what ssh -Q cipher lists>)
 *   source_bytes=67108864
 *   source_created=1
 *   tty=0.412 source.bin   50%   32MB  31.9MB/s   00:01 ETA
 *                               a record scp wrote on its terminal, seconds since scp started
 *   scp_status=0                scp's exit status (128+N when a signal N ended it)
 *   wall_s=1.234                from starting scp to its end
 *   valid=1                     scp ended with status 0 and SOURCE has SIZE_MB MiB
 * Exit status: 0 scp succeeded; 1 scp failed; 2 bad usage or a system error; 3 cipher not offered.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pty.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "virtlab_kernel.h"

#define METER_COLUMNS 160
#define MAX_SIZE_MB (64L * 1024 * 1024)
#define CAPTURE_MAX 8192
#define RECORD_MAX 1024
#define CHUNK (1 << 20)

/* Runs argv with its stdout or stderr (fd) into buf; returns the exit status, or -1. */
static int capture(char *const argv[], int fd, char *buf, size_t size)
{
    int pipefd[2];
    if (pipe(pipefd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(null, fd == 1 ? 2 : 1);
        dup2(pipefd[1], fd);
        close(pipefd[0]);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(pipefd[1]);
    size_t used = 0;
    ssize_t got;
    while ((got = read(pipefd[0], buf + used, size - 1 - used)) > 0 || (got < 0 && errno == EINTR))
        if (got > 0 && (used += (size_t)got) == size - 1)
            break;
    buf[used] = '\0';
    close(pipefd[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The first line of text, cut at the newline. */
static char *first_line(char *text)
{
    text[strcspn(text, "\r\n")] = '\0';
    return text;
}

/* Whether `ssh -Q cipher` lists cipher on a line of its own; prints what it lists when not. */
static int offered(const char *cipher)
{
    char *argv[] = {"ssh", "-Q", "cipher", NULL};
    char list[CAPTURE_MAX];
    if (capture(argv, 1, list, sizeof list) != 0) {
        fprintf(stderr, "scpmeter: ssh -Q cipher failed\n");
        return -1;
    }
    size_t n = strlen(cipher);
    for (char *line = list; *line;) {
        size_t length = strcspn(line, "\n");
        if (length == n && strncmp(line, cipher, n) == 0)
            return 1;
        line += length + (line[length] == '\n');
    }
    for (char *p = list; *p; p++)
        if (*p == '\n')
            *p = p[1] ? ',' : '\0';
    printf("ciphers=%s\n", list);
    return 0;
}

/* SOURCE as size_mb MiB of xorshift64* output (nothing a compressor could shrink), unless it is
 * already that size. Returns 1 when written, 0 when kept, -1 on failure. */
static int make_source(const char *path, long size_mb)
{
    off_t wanted = (off_t)size_mb << 20;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == wanted)
        return 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        perror(path);
        return -1;
    }
    uint64_t *block = malloc(CHUNK);
    if (block == NULL) {
        close(fd);
        return -1;
    }
    uint64_t x = 0x9e3779b97f4a7c15ULL ^ (uint64_t)size_mb;
    for (long mb = 0; mb < size_mb; mb++) {
        for (size_t i = 0; i < CHUNK / sizeof *block; i++) {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            block[i] = x * 0x2545f4914f6cdd1dULL;
        }
        for (size_t done = 0; done < CHUNK;) {
            ssize_t wrote = write(fd, (char *)block + done, CHUNK - done);
            if (wrote < 0 && errno == EINTR)
                continue;
            if (wrote <= 0) {
                perror(path);
                free(block);
                close(fd);
                return -1;
            }
            done += (size_t)wrote;
        }
    }
    free(block);
    if (close(fd) != 0) {
        perror(path);
        return -1;
    }
    return 1;
}

/* One record of scp's terminal, printable characters only, with its arrival time. */
static void emit(char *record, size_t length, double t)
{
    if (length == 0)
        return;
    record[length] = '\0';
    for (size_t i = 0; i < length; i++)
        if ((unsigned char)record[i] < 0x20 || record[i] == 0x7f)
            record[i] = '?';
    printf("tty=%.3f %s\n", t, record);
}

/* Runs argv on a pseudo-terminal, relaying its records; returns its exit status (128+signal). */
static int run_on_tty(char *const argv[], double *wall_s)
{
    struct winsize size = {.ws_row = 24, .ws_col = METER_COLUMNS};
    int master;
    fflush(stdout);
    double started = now_s();
    pid_t pid = forkpty(&master, NULL, NULL, &size);
    if (pid < 0) {
        perror("scpmeter: forkpty");
        return -1;
    }
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "scpmeter: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    char buf[4096], record[RECORD_MAX + 1];
    size_t length = 0;
    /* A record is stamped with the arrival of its first byte: the meter starts each redraw with
     * '\r', so a line's end only shows when the next one begins, a second later. */
    double t = 0, record_t = 0;
    for (;;) {
        ssize_t got = read(master, buf, sizeof buf);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) /* EIO: every holder of the terminal's slave side has closed it */
            break;
        t = now_s() - started;
        for (ssize_t i = 0; i < got; i++) {
            if (buf[i] == '\r' || buf[i] == '\n') {
                emit(record, length, record_t);
                length = 0;
            } else if (length < RECORD_MAX) {
                if (length == 0)
                    record_t = t;
                record[length++] = buf[i];
            }
        }
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            perror("scpmeter: waitpid");
            return -1;
        }
    *wall_s = now_s() - started;
    emit(record, length, record_t);
    close(master);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int usage(const char *name)
{
    fprintf(stderr, "usage: %s -s SIZE_MB -f SOURCE [-c CIPHER] -- scp ARG...\n", name);
    return 2;
}

int main(int argc, char **argv)
{
    long size_mb = 0;
    const char *source = NULL, *cipher = NULL;
    int opt;
    while ((opt = getopt(argc, argv, "+s:f:c:")) != -1) {
        char *end;
        switch (opt) {
        case 's':
            size_mb = strtol(optarg, &end, 10);
            if (*end || size_mb < 1 || size_mb > MAX_SIZE_MB)
                return usage(argv[0]);
            break;
        case 'f':
            source = optarg;
            break;
        case 'c':
            cipher = optarg;
            break;
        default:
            return usage(argv[0]);
        }
    }
    if (size_mb == 0 || source == NULL || optind >= argc)
        return usage(argv[0]);

    char version[CAPTURE_MAX];
    char *ssh_v[] = {"ssh", "-V", NULL};
    if (capture(ssh_v, 2, version, sizeof version) < 0 || !*first_line(version)) {
        fprintf(stderr, "scpmeter: ssh -V said nothing: is OpenSSH's client installed?\n");
        return 2;
    }
    printf("openssh=%s\n", version);
    if (cipher != NULL) {
        int yes = offered(cipher);
        if (yes < 0)
            return 2;
        printf("offered=%d\n", yes);
        if (!yes)
            return 3;
    }
    int created = make_source(source, size_mb);
    if (created < 0)
        return 2;
    struct stat st;
    if (stat(source, &st) != 0)
        return 2;
    printf("source_bytes=%lld\nsource_created=%d\n", (long long)st.st_size, created);

    double wall_s = 0;
    int status = run_on_tty(argv + optind, &wall_s);
    if (status < 0)
        return 2;
    int valid = status == 0 && st.st_size == ((off_t)size_mb << 20);
    printf("scp_status=%d\nwall_s=%.6f\nvalid=%d\n", status, wall_s, valid);
    return valid ? 0 : 1;
}
