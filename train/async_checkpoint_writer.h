// AsyncCheckpointWriter: finishes a checkpoint on a background thread while
// training goes on (gemma_finetune --async-checkpoint; docs/finetune.md,
// "Asynchronous checkpoints").
//
// The training thread stages first (copies this rank's shards into host
// buffers it owns; collectives on the training group happen there and only
// there), then calls Start(). The background thread then:
//
//   1. runs `write` (this rank's files into the checkpoint's temp dir);
//   2. posts its outcome under "<prefix>/<seq>/done/<rank>" in the
//      coordination store ("ok" or the error);
//   3. rank 0: polls the store until every rank has posted (deadline:
//      options.timeout), then, if all are "ok", runs `commit` (read every
//      file's CRC-32, fsync, atomic rename, checkpoint.json, retention) and
//      posts "ok:<path>" or the error under "<prefix>/<seq>/committed";
//      other ranks poll for that key.
//
// So the checkpoint is renamed into place only after every rank's part is
// written, and every rank learns whether it was. The background thread never
// issues a collective on the training group: it talks only to the store,
// by short check()/get()/set() calls with sleeps in between (it never holds
// the store client across a long blocking wait the training thread might
// need). A crash anywhere before the rename leaves a temp dir, which the next
// CheckpointManager::Open() removes: the previous checkpoint stays the newest
// verified one.
//
// At most one save is in flight: Start() REQUIRES that the previous one was
// Wait()ed for (the trainer waits before staging the next save, so a slow
// write delays the next epoch's end, never overlaps it).
#ifndef TPU_DIST_TRAIN_ASYNC_CHECKPOINT_WRITER_H_
#define TPU_DIST_TRAIN_ASYNC_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tpudist::train {

struct AsyncCheckpointWriterOptions {
  c10::intrusive_ptr<c10d::Store> store;  // the job's coordination store
  int rank = 0;
  int world_size = 1;
  std::string key_prefix = "finetune/async_ckpt";
  absl::Duration timeout = absl::Minutes(5);  // for the other ranks' parts + the commit
};

class AsyncCheckpointWriter {
 public:
  explicit AsyncCheckpointWriter(AsyncCheckpointWriterOptions options);
  // Cancels a save still in flight (its store waits end at once with
  // Cancelled; a write already running finishes) and joins it; nothing is
  // committed after that. Call Wait() for the outcome instead.
  ~AsyncCheckpointWriter();
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  // Starts save `sequence` (unique per save within one store) on the
  // background thread. `write` writes this rank's files; `commit` (rank 0
  // only; ignored elsewhere) commits once every rank's part is written and
  // returns the committed path. REQUIRES: !in_flight().
  void Start(int64_t sequence, std::function<absl::Status()> write,
             std::function<absl::StatusOr<std::string>()> commit);

  // Waits for the save in flight and returns the committed path ("" when
  // none was in flight); an error when any rank's part or the commit failed,
  // or the agreement timed out (DeadlineExceeded naming the ranks missing).
  absl::StatusOr<std::string> Wait();

  bool in_flight() const { return thread_.has_value(); }

 private:
  absl::StatusOr<std::string> Run(int64_t sequence, const std::function<absl::Status()>& write,
                                  const std::function<absl::StatusOr<std::string>()>& commit);
  // Polls until `key` exists or the deadline passes; its value.
  absl::StatusOr<std::string> WaitForKey(const std::string& key, absl::Time deadline);

  AsyncCheckpointWriterOptions options_;
  std::atomic<bool> cancelled_{false};
  std::optional<std::thread> thread_;
  absl::StatusOr<std::string> result_;  // written by thread_, read after join
};

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_ASYNC_CHECKPOINT_WRITER_H_
