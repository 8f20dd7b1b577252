#include "train/distributed_sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

namespace tpudist::train {
namespace {

DistributedSampler Make(int64_t n, int world, int rank, bool shuffle,
                        bool drop_last, uint64_t seed = 42) {
  auto s = DistributedSampler::Create(
      {n, world, rank, shuffle, seed, drop_last});
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

// Oracle: a direct transcription of torch's DistributedSampler.__iter__
// applied to our permutation.
std::vector<int64_t> TorchOracle(const std::vector<int64_t>& perm, int world,
                                 int rank, bool drop_last) {
  const int64_t n = static_cast<int64_t>(perm.size());
  int64_t num_samples;
  if (drop_last && n % world != 0) {
    num_samples = (n - world + world - 1) / world;  // ceil((n - w) / w)
  } else {
    num_samples = (n + world - 1) / world;
  }
  const int64_t total = num_samples * world;
  std::vector<int64_t> idx = perm;
  if (!drop_last) {
    const int64_t pad = total - n;
    if (pad <= n) {
      idx.insert(idx.end(), perm.begin(), perm.begin() + pad);
    } else {
      while (static_cast<int64_t>(idx.size()) < total) {
        idx.insert(idx.end(), perm.begin(), perm.end());
      }
    }
  }
  idx.resize(total);
  std::vector<int64_t> out;
  for (int64_t i = rank; i < total; i += world) out.push_back(idx[i]);
  return out;
}

TEST(EpochPermutationTest, IsAPermutationAndDeterministic) {
  for (int64_t n : {1, 2, 7, 100, 1201}) {
    auto p = EpochPermutation(n, true, 7, 3);
    std::vector<int64_t> sorted = p;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> iota(n);
    std::iota(iota.begin(), iota.end(), 0);
    EXPECT_EQ(sorted, iota);
    EXPECT_EQ(p, EpochPermutation(n, true, 7, 3));
  }
  EXPECT_EQ(EpochPermutation(5, false, 7, 3),
            (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(EpochPermutationTest, EpochAndSeedChangeOrder) {
  const auto e0 = EpochPermutation(100, true, 0, 0);
  std::set<std::vector<int64_t>> seen{e0};
  for (int64_t e = 1; e < 20; ++e) seen.insert(EpochPermutation(100, true, 0, e));
  for (uint64_t s = 1; s < 20; ++s) seen.insert(EpochPermutation(100, true, s, 0));
  EXPECT_EQ(seen.size(), 39u);
  std::vector<int64_t> iota(100);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_NE(e0, iota);
}

TEST(EpochPermutationTest, RoughlyUniform) {
  // Position of element 0 over many epochs of n=4: each slot ~1/4.
  std::map<int64_t, int> where;
  for (int64_t e = 0; e < 4000; ++e) {
    auto p = EpochPermutation(4, true, 1, e);
    where[std::find(p.begin(), p.end(), 0) - p.begin()]++;
  }
  for (int pos = 0; pos < 4; ++pos) {
    EXPECT_NEAR(where[pos], 1000, 150) << "slot " << pos;
  }
}

// Exhaustive over small n x world x drop_last x shuffle x epoch.
TEST(DistributedSamplerTest, MatchesTorchSemanticsExhaustively) {
  for (int64_t n = 1; n <= 23; ++n) {
    for (int world = 1; world <= 9; ++world) {
      for (bool drop_last : {false, true}) {
        if (drop_last && n < world) continue;
        for (bool shuffle : {false, true}) {
          for (int64_t epoch : {0, 1, 5}) {
            const auto perm = EpochPermutation(n, shuffle, 42, epoch);
            std::multiset<int64_t> all;
            std::set<int64_t> distinct;
            int64_t per_rank = -1;
            for (int r = 0; r < world; ++r) {
              auto s = Make(n, world, r, shuffle, drop_last);
              s.SetEpoch(epoch);
              const auto got = s.Indices();
              SCOPED_TRACE(::testing::Message() << "n=" << n << " world="
                           << world << " rank=" << r << " drop=" << drop_last
                           << " shuffle=" << shuffle << " epoch=" << epoch);
              ASSERT_EQ(got, TorchOracle(perm, world, r, drop_last));
              ASSERT_EQ(static_cast<int64_t>(got.size()), s.num_samples());
              if (per_rank >= 0) {
                ASSERT_EQ(per_rank, s.num_samples());
              }
              per_rank = s.num_samples();
              all.insert(got.begin(), got.end());
              distinct.insert(got.begin(), got.end());
            }
            if (drop_last) {
              // Disjoint shards of floor(n/world)*world distinct rows.
              ASSERT_EQ(all.size(), distinct.size());
              ASSERT_EQ(static_cast<int64_t>(all.size()), n / world * world);
            } else {
              // Coverage: every row is read; only the padding repeats.
              ASSERT_EQ(static_cast<int64_t>(distinct.size()), n);
              ASSERT_EQ(static_cast<int64_t>(all.size()),
                        (n + world - 1) / world * world);
              if (n % world == 0) {
                ASSERT_EQ(all.size(), distinct.size());
              }
            }
          }
        }
      }
    }
  }
}

TEST(DistributedSamplerTest, DeterministicAcrossInstances) {
  auto a = Make(1000, 16, 5, true, false, 123);
  auto b = Make(1000, 16, 5, true, false, 123);
  a.SetEpoch(2);
  b.SetEpoch(2);
  EXPECT_EQ(a.Indices(), b.Indices());
  b.SetEpoch(3);
  EXPECT_NE(a.Indices(), b.Indices());
  auto c = Make(1000, 16, 5, true, false, 124);
  c.SetEpoch(2);
  EXPECT_NE(a.Indices(), c.Indices());
}

TEST(DistributedSamplerTest, ResumeFromStepIsTheSuffix) {
  for (int64_t batch : {1, 2, 3, 7}) {
    for (bool drop_batch : {false, true}) {
      auto s = Make(101, 4, 2, true, false);
      s.SetEpoch(3);
      const auto full = s.Indices();  // 26 rows
      const int64_t nb = s.NumBatches(batch, drop_batch);
      EXPECT_EQ(nb, drop_batch ? 26 / batch : (26 + batch - 1) / batch);
      // Concatenating every batch gives the (possibly cut) epoch.
      std::vector<int64_t> joined;
      for (int64_t step = 0; step < nb; ++step) {
        auto b = s.BatchIndices(step, batch, drop_batch);
        ASSERT_TRUE(b.ok()) << b.status();
        ASSERT_LE(static_cast<int64_t>(b->size()), batch);
        joined.insert(joined.end(), b->begin(), b->end());
      }
      const int64_t used = drop_batch ? nb * batch : 26;
      EXPECT_EQ(joined, std::vector<int64_t>(full.begin(), full.begin() + used));
      for (int64_t start = 0; start <= nb; ++start) {
        auto rest = s.IndicesFromStep(start, batch, drop_batch);
        ASSERT_TRUE(rest.ok());
        const size_t from =
            std::min(joined.size(), static_cast<size_t>(start * batch));
        EXPECT_EQ(*rest, std::vector<int64_t>(joined.begin() + from,
                                              joined.end()));
      }
      EXPECT_FALSE(s.IndicesFromStep(nb + 1, batch, drop_batch).ok());
      EXPECT_EQ(s.BatchIndices(nb, batch, drop_batch).status().code(),
                absl::StatusCode::kOutOfRange);
    }
  }
  // A fresh sampler (a restarted process) resumes identically.
  auto before = Make(50, 3, 1, true, true, 9);
  before.SetEpoch(4);
  auto after = Make(50, 3, 1, true, true, 9);
  after.SetEpoch(4);
  EXPECT_EQ(*after.IndicesFromStep(2, 4), *before.IndicesFromStep(2, 4));
}

TEST(DistributedSamplerTest, RejectsBadOptions) {
  EXPECT_FALSE(DistributedSampler::Create({0, 1, 0, true, 0, false}).ok());
  EXPECT_FALSE(DistributedSampler::Create({10, 0, 0, true, 0, false}).ok());
  EXPECT_FALSE(DistributedSampler::Create({10, 4, 4, true, 0, false}).ok());
  EXPECT_FALSE(DistributedSampler::Create({10, 4, -1, true, 0, false}).ok());
  auto st = DistributedSampler::Create({3, 4, 0, true, 0, true}).status();
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("world_size 4"));
  auto s = Make(10, 2, 0, true, false);
  EXPECT_FALSE(s.IndicesFromStep(0, 0).ok());
  EXPECT_FALSE(s.IndicesFromStep(-1, 2).ok());
}

TEST(DistributedSamplerTest, SixteenRanksOnTheBundledSize) {
  // The seed's shape: 1024 samples, 16 devices, batch 2 per device.
  std::set<int64_t> seen;
  for (int r = 0; r < 16; ++r) {
    auto s = Make(1024, 16, r, true, false, 0);
    s.SetEpoch(1);
    EXPECT_EQ(s.num_samples(), 64);
    EXPECT_EQ(s.NumBatches(2), 32);
    for (int64_t i : s.Indices()) EXPECT_TRUE(seen.insert(i).second);
  }
  EXPECT_EQ(seen.size(), 1024u);
}

}  // namespace
}  // namespace tpudist::train
