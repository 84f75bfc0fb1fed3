// test/powerloss-layer.test.ts: the power-loss fault layer (test/powerloss/powercutfs.c) on its own. A write
// that no sync made durable is gone after a cut; one that an fsync or an fdatasync made durable is there.
//   npx node --import tsx --test test/powerloss-layer.test.ts     # needs /dev/fuse and libfuse3-dev

import assert from "node:assert/strict";
import {
  closeSync,
  constants,
  existsSync,
  fchmodSync,
  fdatasyncSync,
  fsyncSync,
  linkSync,
  mkdirSync,
  openSync,
  readFileSync,
  readdirSync,
  renameSync,
  statSync,
  truncateSync,
  unlinkSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { tempDir } from "./helpers.ts";
import { fuseSkip, Layer } from "./powerloss/layer.ts";

const skip = await fuseSkip();
const { dir, cleanup } = tempDir("inbox-powercut-");
let layer: Layer;
let n = 0;
// Each test works in a folder of its own, made durable before it starts.
let here: string;
const at = (name: string) => join(here, name);

before(async () => {
  if (skip) return;
  layer = await Layer.mount(join(dir, "backing"), join(dir, "mnt"));
});
after(async () => {
  if (!skip) await layer.unmount();
  cleanup();
});

function fresh(): void {
  here = join(layer.mountpoint, `t${n++}`);
  mkdirSync(here);
  syncDir(layer.mountpoint);
}

function syncDir(path: string): void {
  const fd = openSync(path, "r");
  fsyncSync(fd);
  closeSync(fd);
}

// write writes bytes at an offset and syncs the file as asked, closing it either way.
function write(
  path: string,
  bytes: string | Buffer,
  sync?: "fsync" | "fdatasync",
  flags = constants.O_RDWR | constants.O_CREAT,
  position = 0,
): void {
  const fd = openSync(path, flags, 0o644);
  try {
    writeSync(fd, typeof bytes === "string" ? Buffer.from(bytes) : bytes, 0, bytes.length, position);
    if (sync === "fsync") fsyncSync(fd);
    if (sync === "fdatasync") fdatasyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

const read = (path: string) => readFileSync(path, "utf8");

describe("the power-loss layer", { skip }, () => {
  it("loses a write that was never synced, though it reads back before the cut", async () => {
    fresh();
    write(at("a"), "durable", "fsync");
    write(at("a"), "LOST!!!");
    assert.equal(read(at("a")), "LOST!!!", "before the cut, readers see the write");
    const stats = await layer.stats();
    assert.ok(stats.dirtyPages > 0, `the write is held in memory: ${JSON.stringify(stats)}`);
    const cut = await layer.powerCycle();
    assert.ok(cut.droppedPages > 0);
    assert.equal(read(at("a")), "durable");
  });

  it("keeps a write that was fsynced", async () => {
    fresh();
    write(at("a"), "first", "fsync");
    write(at("a"), "fsynced", "fsync");
    await layer.powerCycle();
    assert.equal(read(at("a")), "fsynced");
  });

  it("keeps a write that was fdatasynced, and one made through a handle opened with O_DSYNC", async () => {
    fresh();
    write(at("a"), "old", "fsync");
    write(at("b"), "old", "fsync");
    write(at("a"), "new", "fdatasync");
    write(at("b"), "new", undefined, constants.O_RDWR | constants.O_DSYNC);
    await layer.powerCycle();
    assert.equal(read(at("a")), "new");
    assert.equal(read(at("b")), "new");
  });

  it("keeps a grown file up to its synced length, and loses what grew after", async () => {
    fresh();
    const first = Buffer.alloc(10_000, "a");
    write(at("grow"), first, "fdatasync");
    write(at("grow"), Buffer.alloc(50_000, "b"), undefined, constants.O_RDWR, 10_000);
    assert.equal(statSync(at("grow")).size, 60_000);
    await layer.powerCycle();
    assert.equal(statSync(at("grow")).size, 10_000);
    assert.deepEqual(readFileSync(at("grow")), first);
  });

  it("keeps every synced write to a file that grew through many syncs", async () => {
    fresh();
    const fd = openSync(at("log"), "w");
    for (let i = 0; i < 100; i++) {
      writeSync(fd, Buffer.from(`line ${i}\n`));
      if (i % 10 === 9) fdatasyncSync(fd);
    }
    closeSync(fd);
    syncDir(here);
    await layer.powerCycle();
    assert.equal(read(at("log")), Array.from({ length: 100 }, (_, i) => `line ${i}\n`).join(""));
  });

  it("undoes an open with O_TRUNC that was not synced", async () => {
    fresh();
    write(at("t"), "kept", "fsync");
    closeSync(openSync(at("t"), constants.O_WRONLY | constants.O_TRUNC));
    assert.equal(read(at("t")), "");
    await layer.powerCycle();
    assert.equal(read(at("t")), "kept");
  });

  it("changes a mode through an open directory, as through a path", async () => {
    fresh();
    const fd = openSync(here, "r");
    try {
      fchmodSync(fd, 0o700);
    } finally {
      closeSync(fd);
    }
    assert.equal(statSync(here).mode & 0o777, 0o700);
  });

  it("undoes a truncate that was not synced, bytes and all", async () => {
    fresh();
    write(at("t"), "0123456789", "fsync");
    truncateSync(at("t"), 3);
    write(at("t"), "X", undefined, constants.O_RDWR, 6);
    assert.equal(read(at("t")), "012\0\0\0X", "the truncated bytes read as zeros when the file grows again");
    await layer.powerCycle();
    assert.equal(read(at("t")), "0123456789");
  });

  it("loses a new file's name without a sync, and keeps it once its folder or the file is synced", async () => {
    fresh();
    write(at("unnamed"), "data", "fsync");
    // fsync of a file commits every name logged before it, as the journal of ext4 or XFS does.
    writeFileSync(at("named-by-dir-sync"), "");
    syncDir(here);
    writeFileSync(at("lost"), "never synced");
    mkdirSync(at("lost-dir"));
    await layer.powerCycle();
    assert.equal(read(at("unnamed")), "data");
    assert.equal(read(at("named-by-dir-sync")), "");
    assert.deepEqual(readdirSync(here).sort(), ["named-by-dir-sync", "unnamed"]);
  });

  it("undoes a rename and an unlink that no sync made durable, bringing back the files they replaced", async () => {
    fresh();
    write(at("old"), "old", "fsync");
    write(at("new"), "new", "fsync");
    write(at("gone"), "gone", "fsync");
    syncDir(here);
    renameSync(at("new"), at("old"));
    unlinkSync(at("gone"));
    linkSync(at("old"), at("link"));
    assert.deepEqual(readdirSync(here).sort(), ["link", "old"]);
    const cut = await layer.powerCycle();
    assert.equal(cut.undone, 3);
    assert.deepEqual(readdirSync(here).sort(), ["gone", "new", "old"]);
    assert.equal(read(at("old")), "old");
    assert.equal(read(at("new")), "new");
    assert.equal(read(at("gone")), "gone");
  });

  it("keeps a rename once its folder is synced, as SQLite and PostgreSQL rely on", async () => {
    fresh();
    write(at("tmp"), "contents", "fsync");
    write(at("target"), "previous", "fsync");
    syncDir(here);
    renameSync(at("tmp"), at("target"));
    syncDir(here);
    await layer.powerCycle();
    assert.deepEqual(readdirSync(here), ["target"]);
    assert.equal(read(at("target")), "contents");
  });

  it("in a harsher cut, keeps some unsynced pages and loses others, never a synced one", async () => {
    fresh();
    write(at("base"), Buffer.alloc(400 * 4096, "s"), "fsync");
    syncDir(here);
    const fd = openSync(at("base"), "r+");
    for (let page = 0; page < 400; page++) writeSync(fd, Buffer.alloc(4096, "u"), 0, 4096, page * 4096);
    closeSync(fd);
    const cut = await layer.powerCycle({ keep: 0.5, seed: 7 });
    assert.ok(cut.keptPages > 100 && cut.droppedPages > 100, JSON.stringify(cut));
    const bytes = readFileSync(at("base"));
    assert.equal(bytes.length, 400 * 4096);
    let kept = 0;
    for (let page = 0; page < 400; page++) {
      const chunk = bytes.subarray(page * 4096, (page + 1) * 4096);
      const letter = String.fromCharCode(chunk[0]!);
      assert.ok(
        chunk.every((b) => b === chunk[0]) && (letter === "s" || letter === "u"),
        `page ${page} is whole, old or new`,
      );
      if (letter === "u") kept++;
    }
    assert.equal(kept, cut.keptPages);
  });

  it("makes everything durable on a clean unmount", async () => {
    fresh();
    write(at("clean"), "unsynced but cleanly unmounted");
    await layer.unmount();
    layer = await Layer.mount(layer.backing, layer.mountpoint);
    assert.equal(read(at("clean")), "unsynced but cleanly unmounted");
  });

  it("fails every request after the cut, until it is mounted again", async () => {
    fresh();
    write(at("f"), "x", "fsync");
    await layer.cut();
    assert.throws(() => readFileSync(at("f")), /EIO|input\/output/i);
    await layer.unmount();
    layer = await Layer.mount(layer.backing, layer.mountpoint);
    assert.equal(existsSync(at("f")), true);
  });
});
