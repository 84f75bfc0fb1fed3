// powercutfs.c: the power-loss tests' fault layer, a FUSE filesystem that passes everything through to a
// backing folder but keeps written file data in memory until the file is fsynced, and forgets it on a cut.
// test/powerloss/layer.ts compiles it (libfuse3-dev) and drives it through stdin:
//   powercutfs BACKING MOUNTPOINT [-o fuse-options]     then lines: cut | cut KEEP SEED | stats | unmount

// What is durable when (the backing folder BACKING/data holds exactly what a disk would keep):
// - File data and size: in memory, per file, until fsync or fdatasync on any handle of that file; an open
//   with O_SYNC or O_DSYNC makes each write durable before it returns. close, sync_file_range, O_DIRECT,
//   msync without fsync and a clean-looking exit make nothing durable. A truncate is data too: until the
//   file is synced, a cut brings back the old size and bytes. No periodic writeback: stricter than any disk.
// - Names (create, mkdir, mknod, symlink, link, unlink, rmdir, rename): applied to BACKING/data at once and
//   logged; durable at the next fsync of a directory, fsync of a file, or fdatasync that changes a size,
//   which commits every one logged before it, in order, as the journal of ext4 or XFS does. A cut undoes
//   the others, newest first (an unlinked or replaced file waits in BACKING/trash until then).
// - chmod, chown and times: durable at once (lenient; neither SQLite nor PostgreSQL relies on them).
// - A clean unmount (the "unmount" line, or umount) is a clean shutdown: everything becomes durable.
// "cut" drops every page and name not yet durable. "cut KEEP SEED" is a harsher real-world cut: each
// unsynced 4 KiB page reaches the disk with probability KEEP, each file's size change too, and a random
// prefix of the logged names commits; pages of 8 KiB database pages may tear. After a cut every request
// fails with EIO until the test unmounts and mounts again, which also empties the kernel's page cache.
// Writes from a shared mmap (SQLite's -shm) reach the layer through the kernel's writeback and are
// volatile like any other write. The kernel's writeback cache and direct_io stay off, so every write()
// reaches the layer before it returns and mmap works.

#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define PAGE 4096

struct page {
  off_t index;
  struct page *next;
  unsigned char bytes[PAGE];
};

// One per backing inode that is open or has unsynced data; renames and unlinks leave it in place.
struct inode {
  dev_t dev;
  ino_t ino;
  int fd;
  int handles;
  off_t size;    // what readers see
  off_t durable; // the backing file's size
  off_t valid;   // backing bytes below this are still the file's; a truncate lowers it until the next sync
  struct page **buckets;
  unsigned bits;
  size_t pages;
  struct inode *next;
};

// What fi->fh points to: an open file (in) or an open directory (dir), never both.
struct handle {
  struct inode *in;
  DIR *dir;
  int flags;
};

enum kind { MADE, GONE, MOVED, SWAPPED, REMOVED_DIR };

// A namespace change not yet durable, with what it takes to undo it.
struct entry {
  enum kind kind;
  char *a, *b;
  int is_dir;          // MADE: a directory
  char trash[32];      // GONE, MOVED: the file it removed or replaced, kept in BACKING/trash until commit
  int replaced_dir;    // MOVED: an empty directory was replaced
  mode_t mode;         // REMOVED_DIR, or MOVED with replaced_dir: the directory to make again
  uid_t uid;
  gid_t gid;
};

static int root = -1, trash = -1;
static const char *mountpoint;
static pthread_mutex_t big = PTHREAD_MUTEX_INITIALIZER;
static int dead;
static struct inode *inodes;
static struct entry *log_entries;
static size_t log_len, log_cap;
static unsigned long trash_seq, syncs;

static const char *rel(const char *path) {
  while (*path == '/') path++;
  return *path ? path : ".";
}

// ---- Pages ----------------------------------------------------------------------------------------

static size_t bucket_of(const struct inode *in, off_t index) {
  return (size_t)(((uint64_t)index * 11400714819323198485ull) >> (64 - in->bits));
}

static struct page *page_find(struct inode *in, off_t index) {
  if (!in->buckets) return NULL;
  for (struct page *p = in->buckets[bucket_of(in, index)]; p; p = p->next)
    if (p->index == index) return p;
  return NULL;
}

static void page_insert(struct inode *in, struct page *p) {
  if (!in->buckets || in->pages >= ((size_t)1 << in->bits) * 2) {
    unsigned bits = in->buckets ? in->bits + 1 : 6;
    struct page **old = in->buckets;
    size_t old_n = old ? (size_t)1 << in->bits : 0;
    in->buckets = calloc((size_t)1 << bits, sizeof *in->buckets);
    if (!in->buckets) abort();
    in->bits = bits;
    for (size_t i = 0; i < old_n; i++)
      for (struct page *q = old[i], *next; q; q = next) {
        next = q->next;
        size_t b = bucket_of(in, q->index);
        q->next = in->buckets[b];
        in->buckets[b] = q;
      }
    free(old);
  }
  size_t b = bucket_of(in, p->index);
  p->next = in->buckets[b];
  in->buckets[b] = p;
  in->pages++;
}

// pages_drop frees the pages at or past first (0: all of them).
static void pages_drop(struct inode *in, off_t first) {
  if (!in->buckets) return;
  for (size_t i = 0; i < (size_t)1 << in->bits; i++) {
    struct page **at = &in->buckets[i];
    while (*at) {
      struct page *p = *at;
      if (p->index >= first) {
        *at = p->next;
        free(p);
        in->pages--;
      } else {
        at = &p->next;
      }
    }
  }
  if (first == 0) {
    free(in->buckets);
    in->buckets = NULL;
    in->bits = 0;
  }
}

// ---- What a file holds: the backing file's valid bytes, then the unsynced pages, up to size ----------

static int view_read(struct inode *in, char *buf, size_t len, off_t off) {
  if (off >= in->size) return 0;
  if ((off_t)len > in->size - off) len = (size_t)(in->size - off);
  size_t done = 0;
  if (off < in->valid) {
    size_t want = (size_t)(in->valid - off) < len ? (size_t)(in->valid - off) : len;
    while (done < want) {
      ssize_t n = pread(in->fd, buf + done, want - done, off + (off_t)done);
      if (n < 0) return -errno;
      if (n == 0) break;
      done += (size_t)n;
    }
  }
  memset(buf + done, 0, len - done);
  for (off_t index = off / PAGE; index * PAGE < off + (off_t)len; index++) {
    struct page *p = page_find(in, index);
    if (!p) continue;
    off_t from = index * PAGE > off ? index * PAGE : off;
    off_t to = (index + 1) * PAGE < off + (off_t)len ? (index + 1) * PAGE : off + (off_t)len;
    memcpy(buf + (from - off), p->bytes + (from - index * PAGE), (size_t)(to - from));
  }
  return (int)len;
}

static int view_write(struct inode *in, const char *buf, size_t len, off_t off) {
  for (off_t index = off / PAGE; index * PAGE < off + (off_t)len; index++) {
    struct page *p = page_find(in, index);
    if (!p) {
      p = malloc(sizeof *p);
      if (!p) return -ENOMEM;
      p->index = index;
      // Past the end the page reads as zeros, as a file that grows over a hole does.
      memset(p->bytes, 0, PAGE);
      int r = view_read(in, (char *)p->bytes, PAGE, index * PAGE);
      if (r < 0) {
        free(p);
        return r;
      }
      page_insert(in, p);
    }
    off_t from = index * PAGE > off ? index * PAGE : off;
    off_t to = (index + 1) * PAGE < off + (off_t)len ? (index + 1) * PAGE : off + (off_t)len;
    memcpy(p->bytes + (from - index * PAGE), buf + (from - off), (size_t)(to - from));
  }
  if (off + (off_t)len > in->size) in->size = off + (off_t)len;
  return (int)len;
}

static void view_truncate(struct inode *in, off_t size) {
  if (size < in->size) {
    pages_drop(in, (size + PAGE - 1) / PAGE);
    // A page kept across the new end is zeroed past it, so a later extension reads zeros there.
    struct page *p = page_find(in, size / PAGE);
    if (p) memset(p->bytes + size % PAGE, 0, PAGE - (size_t)(size % PAGE));
    if (size < in->valid) in->valid = size;
  }
  in->size = size;
}

static int pending(const struct inode *in) {
  return in->pages > 0 || in->size != in->durable || in->valid != in->durable;
}

static int write_page(struct inode *in, struct page *p, off_t limit) {
  off_t start = p->index * PAGE;
  if (start >= limit) return 0;
  size_t n = limit - start < PAGE ? (size_t)(limit - start) : PAGE;
  return pwrite(in->fd, p->bytes, n, start) == (ssize_t)n ? 0 : -errno;
}

// view_sync writes what the file holds to the backing file: it is durable from now on. Says whether the
// size changed (an fdatasync then commits the names too, as the size is metadata a read depends on).
static int view_sync(struct inode *in, int *size_changed) {
  *size_changed = in->size != in->durable || in->valid != in->durable;
  if (in->valid < in->durable && ftruncate(in->fd, in->valid) < 0) return -errno;
  for (size_t i = 0; in->buckets && i < (size_t)1 << in->bits; i++)
    for (struct page *p = in->buckets[i]; p; p = p->next) {
      int r = write_page(in, p, in->size);
      if (r < 0) return r;
    }
  if (ftruncate(in->fd, in->size) < 0) return -errno;
  pages_drop(in, 0);
  in->durable = in->valid = in->size;
  syncs++;
  return 0;
}

// ---- Inodes and handles ---------------------------------------------------------------------------

static struct inode *inode_by_id(dev_t dev, ino_t ino) {
  for (struct inode *in = inodes; in; in = in->next)
    if (in->dev == dev && in->ino == ino) return in;
  return NULL;
}

// inode_adopt takes an fd opened on the backing file and returns its inode, the fd then owned (or closed).
static struct inode *inode_adopt(int fd) {
  struct stat st;
  if (fstat(fd, &st) < 0) {
    close(fd);
    return NULL;
  }
  struct inode *in = inode_by_id(st.st_dev, st.st_ino);
  if (in) {
    close(fd);
    return in;
  }
  in = calloc(1, sizeof *in);
  if (!in) abort();
  in->dev = st.st_dev;
  in->ino = st.st_ino;
  in->fd = fd;
  in->size = in->durable = in->valid = st.st_size;
  in->next = inodes;
  inodes = in;
  return in;
}

static void inode_free(struct inode *in) {
  for (struct inode **at = &inodes; *at; at = &(*at)->next)
    if (*at == in) {
      *at = in->next;
      break;
    }
  pages_drop(in, 0);
  close(in->fd);
  free(in);
}

// inode_settle forgets an inode that no handle holds and that has nothing unsynced.
static void inode_settle(struct inode *in) {
  if (in->handles == 0 && !pending(in)) inode_free(in);
}

static int open_backing(const char *path) {
  int fd = openat(root, rel(path), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 && (errno == EROFS || errno == ETXTBSY)) fd = openat(root, rel(path), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  return fd < 0 ? -errno : fd;
}

// ---- The log of names not yet durable ---------------------------------------------------------------

static struct entry *log_add(enum kind kind, const char *a, const char *b) {
  if (log_len == log_cap) {
    log_cap = log_cap ? log_cap * 2 : 64;
    log_entries = realloc(log_entries, log_cap * sizeof *log_entries);
    if (!log_entries) abort();
  }
  struct entry *e = &log_entries[log_len++];
  memset(e, 0, sizeof *e);
  e->kind = kind;
  e->a = strdup(rel(a));
  e->b = b ? strdup(rel(b)) : NULL;
  return e;
}

static void entry_free(struct entry *e) {
  free(e->a);
  free(e->b);
}

static void entry_commit(struct entry *e) {
  if (e->trash[0] && unlinkat(trash, e->trash, 0) < 0) fprintf(stderr, "powercutfs: commit: unlink trash/%s: %s\n", e->trash, strerror(errno));
  entry_free(e);
}

static int remade_dir(const char *path, const struct entry *e) {
  if (mkdirat(root, path, e->mode & 07777) < 0) return -1;
  return fchownat(root, path, e->uid, e->gid, AT_SYMLINK_NOFOLLOW);
}

// entry_undo puts the namespace back as it was before the entry, which is the newest one left.
static int entry_undo(struct entry *e) {
  int r = 0;
  switch (e->kind) {
  case MADE:
    r = unlinkat(root, e->a, e->is_dir ? AT_REMOVEDIR : 0);
    break;
  case GONE:
    r = renameat(trash, e->trash, root, e->a);
    break;
  case REMOVED_DIR:
    r = remade_dir(e->a, e);
    break;
  case MOVED:
    r = renameat(root, e->b, root, e->a);
    if (r == 0 && e->trash[0]) r = renameat(trash, e->trash, root, e->b);
    if (r == 0 && e->replaced_dir) r = remade_dir(e->b, e);
    break;
  case SWAPPED:
    r = renameat2(root, e->a, root, e->b, RENAME_EXCHANGE);
    break;
  }
  if (r < 0) fprintf(stderr, "powercutfs: undo %d %s %s: %s\n", e->kind, e->a, e->b ? e->b : "", strerror(errno));
  entry_free(e);
  return r;
}

// log_commit makes every logged name durable: a journal commit.
static void log_commit(void) {
  for (size_t i = 0; i < log_len; i++) entry_commit(&log_entries[i]);
  log_len = 0;
}

static int to_trash(const char *path, char *name) {
  snprintf(name, 32, "%lu", ++trash_seq);
  return linkat(root, rel(path), trash, name, 0);
}

static void own(const char *path) {
  struct fuse_context *c = fuse_get_context();
  if (fchownat(root, rel(path), c->uid, c->gid, AT_SYMLINK_NOFOLLOW) < 0)
    fprintf(stderr, "powercutfs: chown %s: %s\n", path, strerror(errno));
}

// ---- Cuts -----------------------------------------------------------------------------------------

static uint64_t rng;
static double uniform(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0;
}

// cut is the power failing: keep < 0 drops everything not durable; else each page (and size change)
// survives with probability keep, and a random prefix of the logged names commits.
static void cut(double keep, uint64_t seed) {
  unsigned long dropped = 0, kept = 0, undone = 0, committed = 0;
  rng = seed ? seed : 88172645463325252ull;
  for (struct inode *in = inodes, *next; in; in = next) {
    next = in->next;
    for (size_t i = 0; in->buckets && i < (size_t)1 << in->bits; i++)
      for (struct page *p = in->buckets[i]; p; p = p->next) {
        if (keep >= 0 && uniform() < keep) {
          kept++;
        } else {
          dropped++;
          p->index = -1;
        }
      }
    if (keep >= 0) {
      int size_kept = uniform() < keep;
      if (size_kept && in->valid < in->durable && ftruncate(in->fd, in->valid) < 0) perror("powercutfs: cut: truncate");
      off_t limit = size_kept ? in->size : in->durable;
      for (size_t i = 0; in->buckets && i < (size_t)1 << in->bits; i++)
        for (struct page *p = in->buckets[i]; p; p = p->next)
          if (p->index >= 0 && write_page(in, p, limit) < 0) perror("powercutfs: cut: write");
      if (size_kept && ftruncate(in->fd, in->size) < 0) perror("powercutfs: cut: extend");
    }
    inode_free(in);
  }
  size_t prefix = keep >= 0 ? (size_t)(uniform() * (double)(log_len + 1)) : 0;
  if (prefix > log_len) prefix = log_len;
  for (size_t i = 0; i < prefix; i++, committed++) entry_commit(&log_entries[i]);
  for (size_t i = log_len; i > prefix; i--, undone++) entry_undo(&log_entries[i - 1]);
  log_len = 0;
  dead = 1;
  printf("cut dropped_pages=%lu kept_pages=%lu undone=%lu committed=%lu\n", dropped, kept, undone, committed);
}

static void stats(void) {
  unsigned long files = 0, pages = 0;
  for (struct inode *in = inodes; in; in = in->next)
    if (pending(in)) {
      files++;
      pages += in->pages;
    }
  printf("stats dirty_files=%lu dirty_pages=%lu pending_names=%zu syncs=%lu dead=%d\n", files, pages, log_len, syncs, dead);
}

static void shutdown_clean(void) {
  for (struct inode *in = inodes, *next; in; in = next) {
    next = in->next;
    int changed;
    if (view_sync(in, &changed) < 0) perror("powercutfs: unmount: sync");
    inode_free(in);
  }
  log_commit();
}

// control reads the test's lines on stdin. Their end (the test gone) is a cut, then an unmount.
static void *control(void *unused) {
  (void)unused;
  char line[256];
  while (fgets(line, sizeof line, stdin)) {
    double keep;
    unsigned long long seed;
    pthread_mutex_lock(&big);
    if (strncmp(line, "cut", 3) == 0) {
      if (dead) printf("error already cut\n");
      else if (sscanf(line, "cut %lf %llu", &keep, &seed) == 2 && keep >= 0 && keep <= 1) cut(keep, seed);
      else if (strcmp(line, "cut\n") == 0) cut(-1, 0);
      else printf("error expected: cut | cut KEEP(0..1) SEED\n");
    } else if (strcmp(line, "stats\n") == 0) {
      stats();
    } else if (strcmp(line, "unmount\n") == 0) {
      // A clean unmount: destroy makes everything durable. No more lines are read, so the end of stdin
      // that follows is not taken for the power failing.
      pthread_mutex_unlock(&big);
      if (umount2(mountpoint, MNT_DETACH) == 0) return NULL;
      printf("error unmount: %s\n", strerror(errno));
      continue;
    } else {
      printf("error unknown command: %s", line);
    }
    pthread_mutex_unlock(&big);
  }
  pthread_mutex_lock(&big);
  if (!dead) cut(-1, 0);
  pthread_mutex_unlock(&big);
  umount2(mountpoint, MNT_DETACH);
  return NULL;
}

// ---- FUSE operations: each takes the one lock; after a cut, every one fails with EIO ----------------

#define ENTER                       \
  pthread_mutex_lock(&big);         \
  if (dead) {                       \
    pthread_mutex_unlock(&big);     \
    return -EIO;                    \
  }
#define LEAVE(r)                    \
  do {                              \
    int r_ = (r);                   \
    pthread_mutex_unlock(&big);     \
    return r_;                      \
  } while (0)
#define ERR(call) ((call) < 0 ? -errno : 0)

static void *op_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
  // Every write reaches the layer before write() returns: no dirty pages kept in the kernel.
  conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
  cfg->use_ino = 1;
  cfg->hard_remove = 1;
  cfg->nullpath_ok = 1;
  cfg->direct_io = 0;
  cfg->kernel_cache = 0;
  cfg->auto_cache = 0;
  cfg->negative_timeout = 0;
  pthread_t t;
  if (pthread_create(&t, NULL, control, NULL) != 0) abort();
  pthread_detach(t);
  printf("ready\n");
  return NULL;
}

static void op_destroy(void *unused) {
  (void)unused;
  pthread_mutex_lock(&big);
  if (!dead) shutdown_clean();
  dead = 1;
  pthread_mutex_unlock(&big);
}

static struct handle *handle_of(struct fuse_file_info *fi) {
  return fi ? (struct handle *)(uintptr_t)fi->fh : NULL;
}

// of is the file an open handle is on; NULL for none, or for a directory.
static struct inode *of(struct fuse_file_info *fi) {
  return fi ? handle_of(fi)->in : NULL;
}

// fd_of is the backing descriptor of an open file or directory, for the calls that change attributes.
static int fd_of(struct fuse_file_info *fi) {
  struct handle *h = handle_of(fi);
  return !h ? -1 : h->in ? h->in->fd : dirfd(h->dir);
}

static int op_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
  ENTER;
  struct inode *in = of(fi);
  int r = in ? ERR(fstat(in->fd, st)) : path ? ERR(fstatat(root, rel(path), st, AT_SYMLINK_NOFOLLOW)) : ERR(fstat(fd_of(fi), st));
  if (r == 0 && S_ISREG(st->st_mode) && (in || (in = inode_by_id(st->st_dev, st->st_ino)))) {
    st->st_size = in->size;
    st->st_blocks = (in->size + 511) / 512;
  }
  LEAVE(r);
}

static int op_readlink(const char *path, char *buf, size_t size) {
  ENTER;
  ssize_t n = readlinkat(root, rel(path), buf, size - 1);
  if (n >= 0) buf[n] = 0;
  LEAVE(n < 0 ? -errno : 0);
}

static int op_mknod(const char *path, mode_t mode, dev_t rdev) {
  ENTER;
  int r = S_ISREG(mode) ? openat(root, rel(path), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, mode) : mknodat(root, rel(path), mode, rdev);
  if (r < 0) LEAVE(-errno);
  if (S_ISREG(mode)) close(r);
  own(path);
  log_add(MADE, path, NULL);
  LEAVE(0);
}

static int op_mkdir(const char *path, mode_t mode) {
  ENTER;
  if (mkdirat(root, rel(path), mode) < 0) LEAVE(-errno);
  own(path);
  log_add(MADE, path, NULL)->is_dir = 1;
  LEAVE(0);
}

static int op_unlink(const char *path) {
  ENTER;
  char name[32];
  if (to_trash(path, name) < 0) LEAVE(-errno);
  if (unlinkat(root, rel(path), 0) < 0) {
    int e = errno;
    unlinkat(trash, name, 0);
    LEAVE(-e);
  }
  strcpy(log_add(GONE, path, NULL)->trash, name);
  LEAVE(0);
}

static int op_rmdir(const char *path) {
  ENTER;
  struct stat st;
  if (fstatat(root, rel(path), &st, AT_SYMLINK_NOFOLLOW) < 0) LEAVE(-errno);
  if (unlinkat(root, rel(path), AT_REMOVEDIR) < 0) LEAVE(-errno);
  struct entry *e = log_add(REMOVED_DIR, path, NULL);
  e->mode = st.st_mode;
  e->uid = st.st_uid;
  e->gid = st.st_gid;
  LEAVE(0);
}

static int op_symlink(const char *target, const char *path) {
  ENTER;
  if (symlinkat(target, root, rel(path)) < 0) LEAVE(-errno);
  own(path);
  log_add(MADE, path, NULL);
  LEAVE(0);
}

static int op_link(const char *from, const char *to) {
  ENTER;
  if (linkat(root, rel(from), root, rel(to), 0) < 0) LEAVE(-errno);
  log_add(MADE, to, NULL);
  LEAVE(0);
}

static int op_rename(const char *from, const char *to, unsigned int flags) {
  ENTER;
  if (flags & RENAME_EXCHANGE) {
    if (renameat2(root, rel(from), root, rel(to), flags) < 0) LEAVE(-errno);
    log_add(SWAPPED, from, to);
    LEAVE(0);
  }
  struct stat a, b;
  if (fstatat(root, rel(from), &a, AT_SYMLINK_NOFOLLOW) < 0) LEAVE(-errno);
  int replacing = fstatat(root, rel(to), &b, AT_SYMLINK_NOFOLLOW) == 0;
  // Two names of one file: rename does nothing, and must not lose either name on a cut.
  if (replacing && a.st_dev == b.st_dev && a.st_ino == b.st_ino) LEAVE(flags & RENAME_NOREPLACE ? -EEXIST : 0);
  // Keep the file it replaces (a hard link in the trash) until the rename is durable; the kernel's
  // rename still decides whether the rename is allowed.
  char name[32] = "";
  if (replacing && !S_ISDIR(b.st_mode) && !(flags & RENAME_NOREPLACE) && to_trash(to, name) < 0) LEAVE(-errno);
  if (renameat2(root, rel(from), root, rel(to), flags) < 0) {
    int e = errno;
    if (name[0]) unlinkat(trash, name, 0);
    LEAVE(-e);
  }
  struct entry *e = log_add(MOVED, from, to);
  strcpy(e->trash, name);
  if (replacing && S_ISDIR(b.st_mode)) {
    e->replaced_dir = 1;
    e->mode = b.st_mode;
    e->uid = b.st_uid;
    e->gid = b.st_gid;
  }
  LEAVE(0);
}

static int op_chmod(const char *path, mode_t mode, struct fuse_file_info *fi) {
  ENTER;
  LEAVE(fi ? ERR(fchmod(fd_of(fi), mode)) : ERR(fchmodat(root, rel(path), mode, 0)));
}

static int op_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi) {
  ENTER;
  LEAVE(fi ? ERR(fchown(fd_of(fi), uid, gid)) : ERR(fchownat(root, rel(path), uid, gid, AT_SYMLINK_NOFOLLOW)));
}

static int op_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi) {
  ENTER;
  LEAVE(fi ? ERR(futimens(fd_of(fi), tv)) : ERR(utimensat(root, rel(path), tv, AT_SYMLINK_NOFOLLOW)));
}

static int op_truncate(const char *path, off_t size, struct fuse_file_info *fi) {
  ENTER;
  struct inode *in = of(fi);
  if (!in) {
    if (!path) LEAVE(-EISDIR);
    int fd = open_backing(path);
    if (fd < 0) LEAVE(fd);
    if (!(in = inode_adopt(fd))) LEAVE(-EIO);
  }
  view_truncate(in, size);
  inode_settle(in);
  LEAVE(0);
}

static int open_handle(int fd, struct fuse_file_info *fi) {
  struct inode *in = inode_adopt(fd);
  if (!in) return -EIO;
  struct handle *h = calloc(1, sizeof *h);
  if (!h) abort();
  h->in = in;
  h->flags = fi->flags;
  in->handles++;
  if ((fi->flags & O_TRUNC) && (fi->flags & O_ACCMODE) != O_RDONLY) view_truncate(in, 0);
  fi->fh = (uintptr_t)h;
  fi->direct_io = 0;
  fi->keep_cache = 0;
  return 0;
}

static int op_open(const char *path, struct fuse_file_info *fi) {
  ENTER;
  int fd = open_backing(path);
  if (fd < 0) LEAVE(fd);
  LEAVE(open_handle(fd, fi));
}

static int op_create(const char *path, mode_t mode, struct fuse_file_info *fi) {
  ENTER;
  int fd = openat(root, rel(path), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd >= 0) {
    own(path);
    log_add(MADE, path, NULL);
  } else if (errno == EEXIST && !(fi->flags & O_EXCL)) {
    fd = open_backing(path);
    if (fd < 0) LEAVE(fd);
  } else {
    LEAVE(-errno);
  }
  LEAVE(open_handle(fd, fi));
}

static int op_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
  (void)path;
  ENTER;
  LEAVE(view_read(of(fi), buf, size, off));
}

static int op_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
  (void)path;
  ENTER;
  struct inode *in = of(fi);
  int r = view_write(in, buf, size, off);
  int flags = handle_of(fi)->flags;
  if (r >= 0 && (flags & O_DSYNC)) {
    int changed, s = view_sync(in, &changed);
    if (s < 0) LEAVE(s);
    if ((flags & O_SYNC) == O_SYNC || changed) log_commit();
  }
  LEAVE(r);
}

static int op_statfs(const char *path, struct statvfs *st) {
  (void)path;
  ENTER;
  LEAVE(ERR(fstatvfs(root, st)));
}

static int op_release(const char *path, struct fuse_file_info *fi) {
  (void)path;
  pthread_mutex_lock(&big);
  // After a cut the inodes are gone already; the handle is all that is left.
  struct handle *h = handle_of(fi);
  if (!dead) {
    h->in->handles--;
    inode_settle(h->in);
  }
  free(h);
  pthread_mutex_unlock(&big);
  return 0;
}

static int op_fsync(const char *path, int datasync, struct fuse_file_info *fi) {
  (void)path;
  ENTER;
  int changed, r = view_sync(of(fi), &changed);
  if (r == 0 && (!datasync || changed)) log_commit();
  LEAVE(r);
}

static int op_opendir(const char *path, struct fuse_file_info *fi) {
  ENTER;
  int fd = openat(root, rel(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) LEAVE(-errno);
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    LEAVE(-errno);
  }
  struct handle *h = calloc(1, sizeof *h);
  if (!h) abort();
  h->dir = d;
  fi->fh = (uintptr_t)h;
  LEAVE(0);
}

static int op_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off, struct fuse_file_info *fi,
                      enum fuse_readdir_flags flags) {
  (void)path, (void)off, (void)flags;
  ENTER;
  DIR *d = handle_of(fi)->dir;
  rewinddir(d);
  for (struct dirent *e; (e = readdir(d));) {
    struct stat st = {.st_ino = e->d_ino, .st_mode = (mode_t)DTTOIF(e->d_type)};
    if (fill(buf, e->d_name, &st, 0, 0)) break;
  }
  LEAVE(0);
}

static int op_releasedir(const char *path, struct fuse_file_info *fi) {
  (void)path;
  struct handle *h = handle_of(fi);
  closedir(h->dir);
  free(h);
  return 0;
}

static int op_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi) {
  (void)path, (void)datasync, (void)fi;
  ENTER;
  log_commit();
  syncs++;
  LEAVE(0);
}

static const struct fuse_operations ops = {
  .init = op_init, .destroy = op_destroy, .getattr = op_getattr, .readlink = op_readlink, .mknod = op_mknod,
  .mkdir = op_mkdir, .unlink = op_unlink, .rmdir = op_rmdir, .symlink = op_symlink, .rename = op_rename,
  .link = op_link, .chmod = op_chmod, .chown = op_chown, .truncate = op_truncate, .open = op_open,
  .read = op_read, .write = op_write, .statfs = op_statfs, .release = op_release, .fsync = op_fsync,
  .opendir = op_opendir, .readdir = op_readdir, .releasedir = op_releasedir, .fsyncdir = op_fsyncdir,
  .create = op_create, .utimens = op_utimens,
};

int main(int argc, char *argv[]) {
  if (argc < 3) {
    fprintf(stderr, "usage: powercutfs BACKING MOUNTPOINT [-o fuse-options]\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  // Modes arrive with the caller's umask applied already.
  umask(0);
  int backing = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (backing < 0) {
    fprintf(stderr, "powercutfs: %s: %s\n", argv[1], strerror(errno));
    return 2;
  }
  mkdirat(backing, "data", 0755);
  mkdirat(backing, "trash", 0700);
  root = openat(backing, "data", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  trash = openat(backing, "trash", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root < 0 || trash < 0) {
    fprintf(stderr, "powercutfs: %s/data or /trash: %s\n", argv[1], strerror(errno));
    return 2;
  }
  // Whatever a previous mount left in the trash was either restored by its cut or committed.
  DIR *t = fdopendir(dup(trash));
  for (struct dirent *e; t && (e = readdir(t));)
    if (e->d_name[0] != '.') unlinkat(trash, e->d_name, 0);
  if (t) closedir(t);
  // The control thread unmounts by this name, whatever the folder the daemon runs in.
  static char where[4096];
  if (!realpath(argv[2], where)) {
    fprintf(stderr, "powercutfs: %s: %s\n", argv[2], strerror(errno));
    return 2;
  }
  mountpoint = where;
  char *args[argc + 4];
  int n = 0;
  args[n++] = argv[0];
  args[n++] = argv[2];
  args[n++] = "-f";
  args[n++] = "-o";
  // allow_other: PostgreSQL runs as its own user; default_permissions: the kernel checks modes, as on a disk.
  args[n++] = "allow_other,default_permissions,fsname=powercutfs,subtype=powercutfs,max_threads=16";
  for (int i = 3; i < argc; i++) args[n++] = argv[i];
  args[n] = NULL;
  return fuse_main(n, args, &ops, NULL);
}
