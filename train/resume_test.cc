// The pieces together: a fake two-rank training loop over the bundled data
// that checkpoints every few steps, "crashes" mid-epoch while writing a
// checkpoint, resumes from LatestComplete() and must read exactly the
// batches the uninterrupted run reads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "train/checkpoint_manager.h"
#include "train/distributed_sampler.h"
#include "train/dolly_dataset.h"
#include "train/internal/test_temp_dir.h"
#include "train/metrics_log.h"
#include "train/tokenized_dataset.h"
#include "testing/source_dir.h"

namespace tpudist::train {
namespace {

constexpr int kWorld = 2;
constexpr int64_t kBatch = 2;
constexpr int64_t kEpochs = 2;
constexpr int64_t kEvery = 5;  // checkpoint every kEvery steps

using test_support::SourceDir;

absl::StatusOr<std::vector<int>> ByteEncode(absl::string_view text) {
  std::vector<int> ids;
  for (unsigned char c : text) ids.push_back(static_cast<int>(c) + 3);
  return ids;
}

// (epoch, step, rank) -> the first token of every row of that batch.
using Trace = std::map<std::tuple<int64_t, int64_t, int>, std::vector<int64_t>>;

struct Loop {
  const TokenizedDataset* data;
  CheckpointManager* ckpt;
  Trace trace;
  // Runs from (epoch, step) to the end, or until crash_at is reached, where
  // it leaves a half-written checkpoint behind and returns false.
  bool Run(int64_t epoch, int64_t step,
           std::pair<int64_t, int64_t> crash_at = {-1, -1}) {
    for (; epoch < kEpochs; ++epoch, step = 0) {
      std::vector<DistributedSampler> ranks;
      for (int r = 0; r < kWorld; ++r) {
        ranks.push_back(*DistributedSampler::Create(
            {data->size(), kWorld, r, true, 1234, false}));
        ranks.back().SetEpoch(epoch);
      }
      const int64_t nb = ranks[0].NumBatches(kBatch);
      for (; step < nb; ++step) {
        for (int r = 0; r < kWorld; ++r) {
          auto ids = ranks[r].BatchIndices(step, kBatch);
          EXPECT_TRUE(ids.ok()) << ids.status();
          auto batch = data->MakeBatch(*ids);
          EXPECT_TRUE(batch.ok()) << batch.status();
          auto& rows = trace[{epoch, step, r}];
          for (int64_t i : *ids) rows.push_back(i);
          EXPECT_EQ(batch->input_ids.size(1), data->seq_len());
        }
        const int64_t done = step + 1;
        if (done % kEvery == 0) {
          auto p = ckpt->BeginWrite();
          EXPECT_TRUE(p.ok());
          std::ofstream(p->path + "/model.pt") << "state@" << epoch << "/" << done;
          if (std::make_pair(epoch, step) == crash_at) return false;
          EXPECT_TRUE(ckpt->Commit(*p, {epoch, done, 1.0 / (1 + done), {}}).ok());
        }
      }
    }
    return true;
  }
};

TEST(ResumeTest, ResumedRunReadsTheSameBatches) {
  auto rows = LoadDollySplit(SourceDir() + "/data/instructions/train.jsonl",
                             "train[:61]");
  ASSERT_TRUE(rows.ok()) << rows.status();
  auto data = TokenizedDataset::Create(*rows, ByteEncode, {64, 0, 2, 1});
  ASSERT_TRUE(data.ok());
  internal::TestTempDir tmp;
  auto open = [&](const std::string& name) {
    CheckpointManagerOptions o;
    o.storage_path = tmp.path();
    o.run_name = name;
    o.num_to_keep = 2;
    o.warn = [](absl::string_view) {};
    return *CheckpointManager::Open(o);
  };

  auto ref_ckpt = open("reference");
  Loop reference{&*data, ref_ckpt.get(), {}};
  ASSERT_TRUE(reference.Run(0, 0));
  // 61 rows / 2 ranks -> 31 per rank -> 16 batches per epoch.
  EXPECT_EQ(reference.trace.size(), static_cast<size_t>(kEpochs * 16 * kWorld));

  auto crash_ckpt = open("crashy");
  Loop first{&*data, crash_ckpt.get(), {}};
  ASSERT_FALSE(first.Run(0, 0, /*crash_at=*/{1, 9}));  // dies writing step 10
  crash_ckpt.reset();

  auto resumed_ckpt = open("crashy");
  auto latest = resumed_ckpt->LatestComplete();
  ASSERT_TRUE(latest.ok() && latest->has_value());
  const int64_t epoch = (*latest)->metadata.epoch;
  const int64_t step = (*latest)->metadata.step;
  EXPECT_EQ(epoch, 1);
  EXPECT_EQ(step, 5);
  Loop second{&*data, resumed_ckpt.get(), {}};
  ASSERT_TRUE(second.Run(epoch, step));

  // Batches up to the checkpoint come from the first life, the rest from the
  // second; together they equal the reference run.
  Trace combined;
  for (const auto& [key, ids] : first.trace) {
    if (std::make_pair(std::get<0>(key), std::get<1>(key)) <
        std::make_pair(epoch, step)) {
      combined[key] = ids;
    }
  }
  for (const auto& [key, ids] : second.trace) combined[key] = ids;
  EXPECT_EQ(combined, reference.trace);
}

}  // namespace
}  // namespace tpudist::train
