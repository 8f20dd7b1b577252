// Links against an installed TpuDist: a RankInfo round trip through the public
// headers, and a one-rank tpu_dist process group doing an allreduce.
// Exit 0 on success.
#include <iostream>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "collectives/process_group_tpu_dist.h"
#include "tpu_runtime/rank_info.h"

int main() {
  tpudist::tpu_runtime::RankInfo info;
  info.rank = 1;
  info.world_size = 2;
  info.slice.accelerator_type = "v6e";
  info.slice.chip_topology = {2, 1};
  const std::string text = tpudist::tpu_runtime::ToString(info);
  std::cout << "consumer: " << text << "\n";
  if (text.find("rank 1/2") == std::string::npos) return 1;

  auto store = c10::make_intrusive<c10d::HashStore>();
  tpudist::collectives::ProcessGroupTpuDist::Options opts;
  opts.group_name = "install_consumer";
  auto pg = c10::make_intrusive<tpudist::collectives::ProcessGroupTpuDist>(store, 0, 1, opts);
  std::vector<at::Tensor> tensors = {at::full({4}, 3.0f)};  // [4]
  pg->allreduce(tensors)->wait();
  const float sum = tensors[0].sum().item<float>();
  std::cout << "consumer: " << pg->getBackendName() << " allreduce sum " << sum << "\n";
  return (pg->getBackendName() == "tpu_dist" && sum == 12.0f) ? 0 : 1;
}
