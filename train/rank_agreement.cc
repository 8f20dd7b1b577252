#include "train/rank_agreement.h"

#include <chrono>
#include <exception>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/exception_message.h"
#include "nlohmann/json.hpp"

namespace tpudist::train {
namespace {

constexpr char kKey[] = "job_fingerprint/rank0";

std::vector<uint8_t> Serialize(const JobFingerprint& fp) {
  const std::string text = nlohmann::json(fp).dump();
  return std::vector<uint8_t>(text.begin(), text.end());
}

}  // namespace

std::vector<std::string> RankDifferences(const JobFingerprint& rank0, const JobFingerprint& mine,
                                         int rank) {
  std::set<std::string> fields;
  for (const auto& [k, v] : rank0) fields.insert(k);
  for (const auto& [k, v] : mine) fields.insert(k);
  std::vector<std::string> out;
  for (const std::string& field : fields) {
    auto a = rank0.find(field), b = mine.find(field);
    const std::string va = a == rank0.end() ? "absent" : a->second;
    const std::string vb = b == mine.end() ? "absent" : b->second;
    if (va != vb) out.push_back(absl::StrCat(field, ": ", va, " on rank 0, ", vb, " on rank ", rank));
  }
  return out;
}

absl::Status CheckRanksAgree(c10d::Store& store, int rank, const JobFingerprint& mine,
                             absl::Duration timeout) {
  JobFingerprint rank0;
  try {
    if (rank == 0) {
      store.set(kKey, Serialize(mine));
      return absl::OkStatus();
    }
    store.wait({kKey}, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
    const std::vector<uint8_t> raw = store.get(kKey);
    rank0 = nlohmann::json::parse(raw.begin(), raw.end()).get<JobFingerprint>();
  } catch (const std::exception& e) {  // c10d stores report errors by throwing
    return absl::UnavailableError(absl::StrCat("rank ", rank, ": could not read rank 0's job fingerprint: ",
                                               collectives::ExceptionMessage(e)));
  }
  const std::vector<std::string> diff = RankDifferences(rank0, mine, rank);
  if (diff.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("rank ", rank, " was started for another job than rank 0 (every rank needs the "
                   "same --model-dir, dataset and training flags): ",
                   absl::StrJoin(diff, "; ")));
}

}  // namespace tpudist::train
