/*
 * Disk trials (seed 000 chapter 7, 001, 003): dd, fio and hdparm run as one command in a fresh
 * directory, with the page cache defeated as far as the environment allows, and saying how.
 *
 * A workload is one argument list run inside an environment that knows nothing of virtlab; a
 * disk trial needs several steps (make a directory, drop the caches, write, drop again, read,
 * remove; or find the block device behind a directory), so this kernel does them, running the
 * real tools with fork/execvp and reporting key=value lines.
 *
 * Usage:
 *   diskio -m dd     [-d DIR] -s SIZE_MB [-b BLOCK_KB] [-r] [-D] [-N]
 *   diskio -m fio    [-d DIR] -s SPACE_MB [-D] -- fio OPTION...
 *   diskio -m hdparm [-d DIR] [-D] [-W]
 *
 *   -d DIR      the directory tested (default "."); dd and fio work in a fresh subdirectory
 *               virtlab-disk-<pid>-XXXXXX of it, removed at the end, and the leftovers of a
 *               killed trial (its pid gone) are removed by the next one
 *   -s MB       dd: the file size in MiB; fio: the MiB its jobs write (checked against the free
 *               space before anything is written)
 *   -b KB       dd block size in KiB (default 1024)
 *   -r          dd: read the file back after writing it
 *   -D          direct I/O (O_DIRECT) where the file system supports it: dd oflag/iflag=direct,
 *               fio --direct=1 (--direct=0 where it is not supported), hdparm --direct
 *   -N          dd: do not drop the whole page cache (sync; echo 3 > /proc/sys/vm/drop_caches),
 *               only the file's own pages (POSIX_FADV_DONTNEED)
 *   -W          hdparm: the whole disk when the directory is on a partition
 *
 * Output (dd):
 *   fs=ext4 odirect=1 odirect_note=ok free_mb=... drop_caches=ok size_mb=... direct=1 ...
 *   write_bytes=... write_s=... write_mbs=... write_wall_s=... write_cache=direct memory_backed=0
 *   read_bytes=... read_s=... read_mbs=... read_wall_s=... read_cache=direct read_resident_pct=0.0
 *   valid=1
 * write_s/read_s are dd's own figures; MB/s are 10^6 bytes per second.
 * odirect=1 when an O_DIRECT write here leaves nothing in the page cache (odirect_note says why
 * not: open-einval, memory-backed for tmpfs, still-cached for an overlay over tmpfs, ...).
 * write_cache: direct (O_DIRECT, fdatasync at the end) | fdatasync | not-defeated (the storage is
 * memory: the file's pages stay cached after being flushed and dropped, memory_backed=1);
 * read_cache: direct | dropped (drop_caches) | fadvise (POSIX_FADV_DONTNEED on the file, where
 * drop_caches is refused, as in a container) | not-defeated; read_resident_pct is the share of
 * the file's pages in the page cache just before the read (mincore), the proof of the method.
 * Output (fio): the env line (fs, odirect, cache=direct|not-defeated), then fio's own output.
 * Output (hdparm): device=/dev/X dev=MAJ:MIN on_partition=0|1 whole_disk=0|1 fs=... direct=0|1,
 * then hdparm's own output.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "virtlab_kernel.h"

#define TRIAL_PREFIX "virtlab-disk-"
#define MAX_SIZE_MB (64L * 1024 * 1024)
#define MAX_BLOCK_KB (1024L * 1024)
/* Slack left free beyond the data: the file system's own blocks (extents, journal). */
#define SPACE_SLACK_MB 16
/* Above this share of the file still cached, a read is not called cache-defeated. */
#define RESIDENT_LIMIT_PCT 1.0

enum mode { MODE_NONE, MODE_DD, MODE_FIO, MODE_HDPARM };

struct options {
    enum mode mode;
    const char *dir;
    long size_mb, block_kb;
    int read_back, direct, no_drop, whole_disk;
    char **tool_argv; /* fio mode: what follows "--" */
};

/* What the directory's file system allows. */
struct place {
    char fs[32];
    int memory_backed;
    int odirect;
    char odirect_note[32];
    long free_mb;
};

struct dd_result {
    long long bytes;
    double seconds, wall_s;
};

static void usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s -m dd     [-d DIR] -s SIZE_MB [-b BLOCK_KB] [-r] [-D] [-N]\n"
            "       %s -m fio    [-d DIR] -s SPACE_MB [-D] -- fio OPTION...\n"
            "       %s -m hdparm [-d DIR] [-D] [-W]\n",
            prog, prog, prog);
}

/* The file system's name from its statfs magic (ext2 and ext3 share ext4's, and its driver). */
static const char *fs_name(long type, int *memory_backed)
{
    static const struct {
        unsigned long magic;
        const char *name;
        int memory;
    } known[] = {
        {0xEF53, "ext4", 0},           {0x58465342, "xfs", 0},       {0x9123683E, "btrfs", 0},
        {0x01021994, "tmpfs", 1},      {0x858458F6, "ramfs", 1},     {0x794C7630, "overlay", 0},
        {0x6969, "nfs", 0},            {0x01021997, "9p", 0},        {0x65735546, "fuse", 0},
        {0x2FC12FC1, "zfs", 0},        {0xF2F52010, "f2fs", 0},      {0xFE534D42, "smb2", 0},
        {0xFF534D42, "cifs", 0},       {0x00C36400, "ceph", 0},      {0x4D44, "vfat", 0},
        {0x5346544E, "ntfs", 0},       {0x73717368, "squashfs", 0},
    };
    *memory_backed = 0;
    for (size_t n = 0; n < sizeof known / sizeof known[0]; n++)
        if ((unsigned long)type == known[n].magic) {
            *memory_backed = known[n].memory;
            return known[n].name;
        }
    return "other";
}

static const char *errno_word(int error)
{
    switch (error) {
    case EROFS: return "read-only";
    case EACCES:
    case EPERM: return "denied";
    case ENOENT: return "absent";
    case EINVAL: return "einval";
    default: return "failed";
    }
}

/*
 * Writes back every dirty page and drops the clean ones: "sync; echo 3 > drop_caches". Only
 * root where /proc/sys is writable may (not in a runc container, where it is read-only).
 */
static const char *drop_caches(void)
{
    sync();
    int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
    if (fd < 0)
        return errno_word(errno);
    const char *result = write(fd, "3\n", 2) == 2 ? "ok" : errno_word(errno);
    close(fd);
    return result;
}

/* The share of the file's pages in the page cache, in percent, or -1 when it cannot be told. */
static double resident_pct(const char *path)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size == 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    long page = sysconf(_SC_PAGESIZE);
    size_t pages = (size_t)((st.st_size + page - 1) / page);
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    unsigned char *vector = malloc(pages);
    double pct = -1;
    if (map != MAP_FAILED && vector != NULL && mincore(map, (size_t)st.st_size, vector) == 0) {
        size_t resident = 0;
        for (size_t n = 0; n < pages; n++)
            resident += vector[n] & 1;
        pct = 100.0 * (double)resident / (double)pages;
    }
    if (map != MAP_FAILED)
        munmap(map, (size_t)st.st_size);
    free(vector);
    close(fd);
    return pct;
}

/*
 * Whether O_DIRECT reaches the storage here: refused (EINVAL) on some file systems, accepted but
 * meaningless on a memory-backed one (tmpfs accepts it since Linux 6.6), and accepted but still
 * caching on others (an overlay whose upper layer is tmpfs, btrfs with compression): the page an
 * O_DIRECT write leaves in the page cache tells.
 */
static void probe_odirect(const char *trial, struct place *place)
{
    snprintf(place->odirect_note, sizeof place->odirect_note, "ok");
    place->odirect = 0;
    char *path = join(trial, "odirect-probe");
    void *buffer = NULL;
    if (path == NULL || posix_memalign(&buffer, 4096, 4096) != 0) {
        snprintf(place->odirect_note, sizeof place->odirect_note, "no-memory");
        free(path);
        return;
    }
    memset(buffer, 0, 4096);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_DIRECT, 0600);
    if (fd < 0) {
        snprintf(place->odirect_note, sizeof place->odirect_note, "open-%s", errno_word(errno));
    } else {
        if (write(fd, buffer, 4096) != 4096)
            snprintf(place->odirect_note, sizeof place->odirect_note, "write-%s", errno_word(errno));
        else if (place->memory_backed)
            snprintf(place->odirect_note, sizeof place->odirect_note, "memory-backed");
        else if (resident_pct(path) > 50.0)
            snprintf(place->odirect_note, sizeof place->odirect_note, "still-cached");
        else
            place->odirect = 1;
        close(fd);
    }
    unlink(path);
    free(path);
    free(buffer);
}

static void describe_place(const char *dir, struct place *place)
{
    struct statfs fs;
    struct statvfs vfs;
    snprintf(place->fs, sizeof place->fs, "unknown");
    place->memory_backed = 0;
    place->free_mb = -1;
    if (statfs(dir, &fs) == 0)
        snprintf(place->fs, sizeof place->fs, "%s", fs_name((long)fs.f_type, &place->memory_backed));
    if (statvfs(dir, &vfs) == 0)
        place->free_mb = (long)((unsigned long long)vfs.f_bavail * vfs.f_frsize / (1024 * 1024));
}

static void log_argv(char *const argv[])
{
    fprintf(stderr, "diskio: running");
    for (char *const *arg = argv; *arg != NULL; arg++)
        fprintf(stderr, " %s", *arg);
    fprintf(stderr, "\n");
}

/*
 * Runs argv in cwd and waits for it; its standard error goes to err_path when given. SIGINT,
 * SIGTERM and SIGHUP are passed on to the child rather than ending this process, so that the
 * trial directory is still removed; *signalled is the first of them (0 if none). Returns the
 * exit status (128 + signal for a killed child), or -1 when the child could not be started.
 */
static int run(char *const argv[], const char *cwd, const char *err_path, double *wall_s, int *signalled)
{
    sigset_t watched, previous;
    sigemptyset(&watched);
    sigaddset(&watched, SIGCHLD);
    sigaddset(&watched, SIGINT);
    sigaddset(&watched, SIGTERM);
    sigaddset(&watched, SIGHUP);
    log_argv(argv);
    fflush(stdout);
    fflush(stderr);
    sigprocmask(SIG_BLOCK, &watched, &previous);
    double t0 = now_s();
    pid_t pid = fork();
    if (pid < 0) {
        perror("diskio: fork");
        sigprocmask(SIG_SETMASK, &previous, NULL);
        return -1;
    }
    if (pid == 0) {
        sigprocmask(SIG_SETMASK, &previous, NULL);
        if (cwd != NULL && chdir(cwd) != 0)
            _exit(126);
        if (err_path != NULL) {
            int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd < 0 || dup2(fd, STDERR_FILENO) < 0)
                _exit(126);
            close(fd);
        }
        /* dd's figures are read back in the C locale's format. */
        setenv("LC_ALL", "C", 1);
        execvp(argv[0], argv);
        fprintf(stderr, "diskio: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int status = 0;
    for (;;) {
        pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid)
            break;
        if (done < 0 && errno != EINTR) {
            perror("diskio: waitpid");
            sigprocmask(SIG_SETMASK, &previous, NULL);
            return -1;
        }
        struct timespec tick = {1, 0};
        int sig = sigtimedwait(&watched, NULL, &tick);
        if (sig > 0 && sig != SIGCHLD) {
            if (*signalled == 0)
                *signalled = sig;
            kill(pid, sig);
        }
    }
    *wall_s = now_s() - t0;
    sigprocmask(SIG_SETMASK, &previous, NULL);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0)
        fprintf(stderr, "diskio: %s failed (status %d)%s\n", argv[0], code,
                code == 127 ? "; is it installed in this environment?" : "");
    return code;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    if (remove(path) != 0)
        perror(path);
    return 0;
}

static void remove_tree(const char *path)
{
    nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/*
 * Removes the trial directories in dir whose process is gone: what a trial killed outright
 * (SIGKILL on a timeout) left behind, which may be gigabytes.
 */
static void remove_leftovers(const char *dir)
{
    DIR *listing = opendir(dir);
    if (listing == NULL)
        return;
    struct dirent *entry;
    while ((entry = readdir(listing)) != NULL) {
        const char *name = entry->d_name;
        if (strncmp(name, TRIAL_PREFIX, strlen(TRIAL_PREFIX)) != 0)
            continue;
        char *end;
        long pid = strtol(name + strlen(TRIAL_PREFIX), &end, 10);
        if (pid <= 0 || *end != '-' || strlen(end) != 7)
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char *path = join(dir, name);
        if (path != NULL) {
            fprintf(stderr, "diskio: removing %s, left by a trial that was killed\n", path);
            remove_tree(path);
        }
        free(path);
    }
    closedir(listing);
}

static char *make_trial_dir(const char *dir)
{
    struct stat st;
    int error = stat(dir, &st) != 0 ? errno : 0;
    if (error != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "diskio: %s: %s\n", dir, error != 0 ? strerror(error) : "not a directory");
        return NULL;
    }
    remove_leftovers(dir);
    char name[64];
    snprintf(name, sizeof name, TRIAL_PREFIX "%ld-XXXXXX", (long)getpid());
    char *trial = join(dir, name);
    if (trial != NULL && mkdtemp(trial) == NULL) {
        fprintf(stderr, "diskio: cannot make a directory in %s: %s\n", dir, strerror(errno));
        free(trial);
        return NULL;
    }
    return trial;
}

static int enough_space(const struct place *place, const char *dir, long need_mb)
{
    if (place->free_mb < 0 || place->free_mb >= need_mb + SPACE_SLACK_MB)
        return 1;
    fprintf(stderr,
            "diskio: %s has %ld MiB free; the trial writes %ld MiB (and leaves %d MiB slack): "
            "choose a smaller size or another directory\n",
            dir, place->free_mb, need_mb, SPACE_SLACK_MB);
    return 0;
}

static void print_place(const struct place *place)
{
    printf("fs=%s odirect=%d odirect_note=%s free_mb=%ld", place->fs, place->odirect,
           place->odirect_note, place->free_mb);
}

/* dd's closing line: "N bytes (...) copied, S s, R MB/s" in the C locale. */
static int read_dd_figures(const char *path, struct dd_result *result)
{
    FILE *in = fopen(path, "r");
    if (in == NULL)
        return -1;
    char *line = NULL;
    size_t size = 0;
    int found = -1;
    while (getline(&line, &size, in) >= 0) {
        long long bytes;
        const char *copied = strstr(line, " copied, ");
        if (copied == NULL || sscanf(line, "%lld bytes", &bytes) != 1)
            continue;
        char *end;
        double seconds = strtod(copied + strlen(" copied, "), &end);
        if (end == copied + strlen(" copied, ") || strncmp(end, " s,", 3) != 0)
            continue;
        line[strcspn(line, "\n")] = '\0';
        printf("# dd: %s\n", line);
        result->bytes = bytes;
        result->seconds = seconds;
        found = 0;
    }
    free(line);
    fclose(in);
    return found;
}

static int dd_pass(const struct options *opt, const char *trial, int writing, int direct,
                   struct dd_result *result, int *signalled)
{
    char bs[32], count[32], in[PATH_MAX], out[PATH_MAX];
    snprintf(bs, sizeof bs, "bs=%ldK", opt->block_kb);
    snprintf(count, sizeof count, "count=%ld", opt->size_mb * 1024 / opt->block_kb);
    snprintf(in, sizeof in, "if=%s", writing ? "/dev/zero" : "dd.dat");
    snprintf(out, sizeof out, "of=%s", writing ? "dd.dat" : "/dev/null");
    char *argv[8] = {"dd", in, out, bs, count, NULL, NULL, NULL};
    int n = 5;
    if (writing)
        argv[n++] = "conv=fdatasync";
    if (direct)
        argv[n++] = writing ? "oflag=direct" : "iflag=direct";
    char *log = join(trial, writing ? "dd-write.log" : "dd-read.log");
    if (log == NULL)
        return -1;
    int code = run(argv, trial, log, &result->wall_s, signalled);
    int figures = code == 0 ? read_dd_figures(log, result) : -1;
    if (code != 0) {
        FILE *err = fopen(log, "r");
        char buffer[4096];
        size_t got;
        while (err != NULL && (got = fread(buffer, 1, sizeof buffer, err)) > 0)
            fwrite(buffer, 1, got, stderr);
        if (err != NULL)
            fclose(err);
    } else if (figures != 0) {
        fprintf(stderr, "diskio: no \"bytes ... copied, S s\" line from dd\n");
    }
    free(log);
    return code == 0 && figures == 0 ? 0 : -1;
}

static void print_dd(const char *phase, const struct dd_result *result)
{
    double mbs = result->seconds > 0 ? (double)result->bytes / result->seconds / 1e6 : 0;
    printf("%s_bytes=%lld %s_s=%.6f %s_mbs=%.3f %s_wall_s=%.6f", phase, result->bytes, phase,
           result->seconds, phase, mbs, phase, result->wall_s);
}

/* Drops the file's own pages from the page cache (no privilege needed); 0 when it could. */
static int fadvise_out(const char *file)
{
    int fd = open(file, O_RDONLY);
    /* Dirty pages are not dropped: dd's fdatasync has written them already; this is for sure. */
    if (fd < 0)
        return -1;
    int status = fdatasync(fd) == 0 && posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0 ? 0 : -1;
    close(fd);
    return status;
}

/* Makes the coming read miss the page cache, and names how: dropped, fadvise or not-defeated. */
static const char *uncache_for_read(const struct options *opt, const char *file, double *resident)
{
    const char *method = "not-defeated";
    if (!opt->no_drop && strcmp(drop_caches(), "ok") == 0)
        method = "dropped";
    else if (fadvise_out(file) == 0)
        method = "fadvise";
    *resident = resident_pct(file);
    if (*resident < 0 || *resident > RESIDENT_LIMIT_PCT)
        method = "not-defeated";
    return method;
}

static int dd_trial(const struct options *opt, const char *trial, const struct place *place,
                    int *signalled)
{
    int direct = opt->direct && place->odirect;
    const char *dropped = opt->no_drop ? "skipped" : drop_caches();
    print_place(place);
    printf(" drop_caches=%s size_mb=%ld block_kb=%ld direct=%d direct_requested=%d\n", dropped,
           opt->size_mb, opt->block_kb, direct, opt->direct);

    struct dd_result wrote = {0}, read = {0};
    if (dd_pass(opt, trial, 1, direct, &wrote, signalled) != 0)
        return 1;
    /*
     * Pages that stay cached after the file was flushed and its pages dropped are the storage
     * itself (tmpfs, also under an overlay): neither the write nor a read reached a disk.
     */
    char *file = join(trial, "dd.dat");
    if (file == NULL)
        return 1;
    double kept = fadvise_out(file) == 0 ? resident_pct(file) : -1;
    int memory = place->memory_backed || kept > RESIDENT_LIMIT_PCT;
    const char *write_cache = memory ? "not-defeated" : direct ? "direct" : "fdatasync";
    print_dd("write", &wrote);
    printf(" write_cache=%s memory_backed=%d\n", write_cache, memory);
    long long expected = (long long)opt->size_mb * 1024 * 1024;
    int valid = wrote.bytes == expected;

    if (opt->read_back && *signalled == 0) {
        double resident = -1;
        int read_direct = direct && !memory;
        const char *read_cache = read_direct ? "direct" : uncache_for_read(opt, file, &resident);
        if (read_direct)
            resident = resident_pct(file);
        if (dd_pass(opt, trial, 0, read_direct, &read, signalled) != 0) {
            free(file);
            return 1;
        }
        print_dd("read", &read);
        printf(" read_cache=%s read_resident_pct=%.1f\n", read_cache, resident);
        valid = valid && read.bytes == expected;
    }
    free(file);
    printf("valid=%d\n", valid);
    return valid ? 0 : 1;
}

/* fio with its options, in the trial directory; --direct=1 or 0 goes first when -D is given. */
static int fio_trial(const struct options *opt, const char *trial, const struct place *place,
                     int *signalled)
{
    size_t count = 0;
    while (opt->tool_argv[count] != NULL)
        count++;
    char **argv = calloc(count + 2, sizeof *argv);
    if (argv == NULL)
        return 1;
    argv[0] = opt->tool_argv[0];
    size_t n = 1;
    int direct = opt->direct && place->odirect;
    if (opt->direct)
        argv[n++] = direct ? "--direct=1" : "--direct=0";
    for (size_t k = 1; k < count; k++)
        argv[n++] = opt->tool_argv[k];
    argv[n] = NULL;
    print_place(place);
    printf(" direct=%d direct_requested=%d cache=%s\n", direct, opt->direct,
           direct ? "direct" : "not-defeated");
    double wall_s = 0;
    int code = run(argv, trial, NULL, &wall_s, signalled);
    free(argv);
    return code == 0 ? 0 : 1;
}

/* /sys/dev/block/MAJ:MIN resolved: the device's sysfs directory, or NULL. */
static char *sysfs_of(dev_t dev)
{
    char link[64];
    snprintf(link, sizeof link, "/sys/dev/block/%u:%u", major(dev), minor(dev));
    return realpath(link, NULL);
}

static int read_dev(const char *sysfs, dev_t *dev)
{
    char *path = join(sysfs, "dev");
    FILE *in = path != NULL ? fopen(path, "r") : NULL;
    unsigned maj, min;
    int ok = in != NULL && fscanf(in, "%u:%u", &maj, &min) == 2;
    if (in != NULL)
        fclose(in);
    free(path);
    if (ok)
        *dev = makedev(maj, min);
    return ok ? 0 : -1;
}

/*
 * hdparm -t on the block device holding dir: st_dev -> /sys/dev/block/MAJ:MIN -> /dev/<name>.
 * The device itself (a partition when the file system is on one), or with -W its disk.
 */
static int hdparm_trial(const struct options *opt, const char *dir)
{
    struct stat st;
    if (stat(dir, &st) != 0) {
        fprintf(stderr, "diskio: %s: %s\n", dir, strerror(errno));
        return 1;
    }
    int memory_backed;
    struct statfs fs;
    const char *fs_type = statfs(dir, &fs) == 0 ? fs_name((long)fs.f_type, &memory_backed) : "unknown";
    char *sysfs = sysfs_of(st.st_dev);
    if (sysfs == NULL) {
        fprintf(stderr,
                "diskio: no block device backs %s: it is on %s, device %u:%u, which is not in "
                "/sys/dev/block (overlay, tmpfs, NFS, FUSE and btrfs have none to time)\n",
                dir, fs_type, major(st.st_dev), minor(st.st_dev));
        return 1;
    }
    char *partition_file = join(sysfs, "partition");
    int partition = partition_file != NULL && access(partition_file, F_OK) == 0;
    free(partition_file);
    dev_t dev = st.st_dev;
    if (opt->whole_disk && partition) {
        char *parent = strdup(sysfs);
        if (parent == NULL)
            return 1;
        free(sysfs);
        sysfs = strdup(dirname(parent));
        free(parent);
        if (sysfs == NULL || read_dev(sysfs, &dev) != 0) {
            fprintf(stderr, "diskio: cannot find the disk of the partition behind %s\n", dir);
            free(sysfs);
            return 1;
        }
    }
    const char *name = strrchr(sysfs, '/') + 1;
    char node[PATH_MAX];
    snprintf(node, sizeof node, "/dev/%s", name);
    struct stat nst;
    int missing = stat(node, &nst) != 0 ? errno : 0;
    if (missing != 0 || !S_ISBLK(nst.st_mode) || nst.st_rdev != dev) {
        fprintf(stderr,
                "diskio: %s is on %s (%u:%u), but %s is not that block device here (%s): this "
                "environment is given no device node for it (a container sees no host disk)\n",
                dir, name, major(dev), minor(dev), node,
                missing != 0 ? strerror(missing) : "another device");
        free(sysfs);
        return 1;
    }
    int fd = open(node, O_RDONLY);
    if (fd < 0) {
        fprintf(stderr, "diskio: cannot open %s for reading: %s (reading a raw disk needs root, "
                        "and a device cgroup or sandbox may forbid it)\n",
                node, strerror(errno));
        free(sysfs);
        return 1;
    }
    close(fd);
    printf("device=%s dev=%u:%u on_partition=%d whole_disk=%d fs=%s direct=%d\n", node, major(dev),
           minor(dev), partition, opt->whole_disk && partition, fs_type, opt->direct);
    free(sysfs);
    char *argv[] = {"hdparm", "-t", node, NULL, NULL};
    if (opt->direct) {
        argv[2] = "--direct";
        argv[3] = node;
    }
    log_argv(argv);
    fflush(stdout);
    fflush(stderr);
    execvp(argv[0], argv);
    fprintf(stderr, "diskio: cannot run hdparm: %s; is it installed in this environment?\n",
            strerror(errno));
    return 127;
}

static int parse_options(int argc, char **argv, struct options *opt)
{
    int c;
    while ((c = getopt(argc, argv, "+m:d:s:b:rDNW")) != -1) {
        int bad = 0;
        switch (c) {
        case 'm':
            opt->mode = strcmp(optarg, "dd") == 0       ? MODE_DD
                        : strcmp(optarg, "fio") == 0    ? MODE_FIO
                        : strcmp(optarg, "hdparm") == 0 ? MODE_HDPARM
                                                        : MODE_NONE;
            bad = opt->mode == MODE_NONE;
            break;
        case 'd': opt->dir = optarg; break;
        case 's': bad = !parse_long(optarg, 1, MAX_SIZE_MB, &opt->size_mb); break;
        case 'b': bad = !parse_long(optarg, 1, MAX_BLOCK_KB, &opt->block_kb); break;
        case 'r': opt->read_back = 1; break;
        case 'D': opt->direct = 1; break;
        case 'N': opt->no_drop = 1; break;
        case 'W': opt->whole_disk = 1; break;
        default: return -1;
        }
        if (bad)
            return -1;
    }
    switch (opt->mode) {
    case MODE_DD:
        /* Whole blocks only, so that the size written is the size asked for. */
        return optind == argc && opt->size_mb > 0 && opt->size_mb * 1024 % opt->block_kb == 0 ? 0 : -1;
    case MODE_FIO:
        if (optind >= argc || opt->size_mb <= 0)
            return -1;
        opt->tool_argv = argv + optind;
        return 0;
    case MODE_HDPARM: return optind == argc ? 0 : -1;
    default: return -1;
    }
}

int main(int argc, char **argv)
{
    struct options opt = {MODE_NONE, ".", 0, 1024, 0, 0, 0, 0, NULL};
    if (parse_options(argc, argv, &opt) != 0) {
        usage(argv[0]);
        return 2;
    }
    /* Absolute, because the tools run with the trial directory as their working directory. */
    char *dir = realpath(opt.dir, NULL);
    if (dir == NULL) {
        fprintf(stderr, "diskio: %s: %s\n", opt.dir, strerror(errno));
        return 1;
    }
    if (opt.mode == MODE_HDPARM) {
        int status = hdparm_trial(&opt, dir);
        free(dir);
        return status;
    }
    struct place place;
    describe_place(dir, &place);
    char *trial = enough_space(&place, dir, opt.size_mb) ? make_trial_dir(dir) : NULL;
    free(dir);
    if (trial == NULL)
        return 1;
    probe_odirect(trial, &place);
    int signalled = 0;
    int status = opt.mode == MODE_DD ? dd_trial(&opt, trial, &place, &signalled)
                                     : fio_trial(&opt, trial, &place, &signalled);
    remove_tree(trial);
    free(trial);
    fflush(stdout);
    if (signalled != 0) {
        signal(signalled, SIG_DFL);
        raise(signalled);
    }
    return status;
}
