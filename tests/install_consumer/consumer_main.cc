// Links against an installed TpuDist (built on the torch wheel's libtorch): a
// RankInfo round trip through the public headers, then a multi-rank tpu_dist
// process group from the one-call factory (ranks as threads over a
// HashStore) doing an allreduce, then TpuDist::train's DistributedSampler
// sharding 10 rows over 3 ranks as torch.utils.data.DistributedSampler does.
// Exit 0 on success.
#include <cstdint>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "collectives/process_group_factory.h"
#include "tpu_runtime/rank_info.h"
#include "train/distributed_sampler.h"

int main() {
  tpudist::tpu_runtime::RankInfo info;
  info.rank = 1;
  info.world_size = 2;
  info.slice.accelerator_type = "v6e";
  info.slice.chip_topology = {2, 1};
  const std::string text = tpudist::tpu_runtime::ToString(info);
  std::cout << "consumer: " << text << "\n";
  if (text.find("rank 1/2") == std::string::npos) return 1;

  constexpr int kWorld = 3;
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<int> ok(kWorld, 0);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kWorld; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        tpudist::collectives::ProcessGroupTpuDist::Options opts;
        opts.group_name = "install_consumer";
        opts.timeout = std::chrono::seconds(30);
        c10::intrusive_ptr<c10d::ProcessGroup> pg =
            tpudist::collectives::NewTpuDistProcessGroup(store, rank, kWorld, opts);
        std::vector<at::Tensor> tensors = {at::full({4}, rank + 1.0f)};  // [4]
        pg->allreduce(tensors)->wait();
        const float sum = tensors[0].sum().item<float>();  // 4 * (1 + 2 + 3)
        const std::string backend = pg->getBackend(c10::DeviceType::CPU)->getBackendName();
        ok[rank] = backend == "tpu_dist" && sum == 24.0f;
        if (rank == 0) {
          std::cout << "consumer: " << backend << " allreduce over " << kWorld
                    << " ranks, sum " << sum << "\n";
        }
      } catch (const std::exception& e) {
        std::cerr << "consumer: rank " << rank << ": " << e.what() << "\n";
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int v : ok) {
    if (!v) return 1;
  }

  // torch's DistributedSampler(range(10), num_replicas=3, rank=1,
  // shuffle=False): indices 0..9 padded with 0, 1 to 12, rank 1 takes
  // positions 1, 4, 7, 10.
  tpudist::train::SamplerOptions sampler_options;
  sampler_options.dataset_size = 10;
  sampler_options.world_size = 3;
  sampler_options.rank = 1;
  sampler_options.shuffle = false;
  absl::StatusOr<tpudist::train::DistributedSampler> sampler =
      tpudist::train::DistributedSampler::Create(sampler_options);
  if (!sampler.ok()) {
    std::cerr << "consumer: " << sampler.status() << "\n";
    return 1;
  }
  const std::vector<int64_t> rows = sampler->Indices();
  std::cout << "consumer: DistributedSampler rank 1/3 of 10 rows:";
  for (int64_t r : rows) std::cout << " " << r;
  std::cout << "\n";
  if (rows != std::vector<int64_t>{1, 4, 7, 0}) return 1;
  return 0;
}
