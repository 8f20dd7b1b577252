// Links against an installed TpuDist and checks a RankInfo round trip through
// the public headers. Exit 0 on success.
#include <iostream>

#include "tpu_runtime/rank_info.h"

int main() {
  tpudist::tpu_runtime::RankInfo info;
  info.rank = 1;
  info.world_size = 2;
  info.slice.accelerator_type = "v6e";
  info.slice.chip_topology = {2, 1};
  const std::string text = tpudist::tpu_runtime::ToString(info);
  std::cout << "consumer: " << text << "\n";
  return text.find("rank 1/2") == std::string::npos ? 1 : 0;
}
