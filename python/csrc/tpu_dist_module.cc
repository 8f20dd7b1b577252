// tpu_dist._C: the Python binding of the tpu_dist c10d backend.
//
// Exposes ProcessGroupTpuDist as a subclass of torch's own
// torch._C._distributed_c10d.Backend (the pybind11 type torch registered), so
// the object returned to torch.distributed's backend registry is a real c10d
// Backend: torch's ProcessGroup front end dispatches CPU ops to it exactly as
// to Gloo. Also exposes RankInfo discovery. torch must be imported first
// (tpu_dist/__init__.py does), which registers the base types.
//
// RankInfo is a type of its own (read-only properties; info["rank"] too), and
// a group made with one takes its placement from it, not from TPU_*.
//
// Errors: the backend's c10::Error becomes RuntimeError (torch's translator);
// a discovery failure is a ValueError naming the variable.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "collectives/flight_recorder_dump.h"
#include "collectives/process_group_tpu_dist.h"
#include "distributed/group_config.h"
#include "distributed/init_process_group.h"
#include "tpu_runtime/env_discovery.h"
#include "tpu_runtime/rank_info.h"

namespace py = pybind11;

namespace {

// The holder of a Python-owned ProcessGroupTpuDist: it drops its reference
// with the GIL released. The group's destructor joins its op workers, and a
// worker that drops the last C++ reference to an op's tensor needs the GIL
// (torch keeps a tensor's Python object alive for as long as C++ holds the
// tensor, and frees it under the GIL). Destroyed by a GIL holder, the two
// waited on each other forever (a recv completing just before its rank
// dropped the group). torch binds its own Backend and ProcessGroup with a
// holder of the same kind; the layout is one intrusive_ptr, as pybind11
// expects of torch's intrusive_ptr<Backend> arguments that read it.
template <typename T>
class GilFreeDestructorHolder {
 public:
  GilFreeDestructorHolder() = default;
  // From a live object (pybind11 builds holders from raw pointers).
  explicit GilFreeDestructorHolder(T* p)
      : ptr_(c10::intrusive_ptr<T>::unsafe_reclaim_from_nonowning(p)) {}
  explicit GilFreeDestructorHolder(c10::intrusive_ptr<T> p) : ptr_(std::move(p)) {}
  GilFreeDestructorHolder(const GilFreeDestructorHolder&) = default;
  GilFreeDestructorHolder(GilFreeDestructorHolder&&) noexcept = default;
  GilFreeDestructorHolder& operator=(const GilFreeDestructorHolder&) = default;
  GilFreeDestructorHolder& operator=(GilFreeDestructorHolder&&) noexcept = default;
  ~GilFreeDestructorHolder() {
    if (ptr_ && PyGILState_Check()) {
      py::gil_scoped_release release;
      ptr_.reset();
    }
  }
  T* get() const { return ptr_.get(); }

 private:
  c10::intrusive_ptr<T> ptr_;
};

}  // namespace

PYBIND11_DECLARE_HOLDER_TYPE(T, GilFreeDestructorHolder<T>, true);

namespace {

using tpudist::collectives::ProcessGroupTpuDist;
static_assert(sizeof(GilFreeDestructorHolder<ProcessGroupTpuDist>) ==
                  sizeof(c10::intrusive_ptr<c10d::Backend>),
              "torch reads this holder as an intrusive_ptr<Backend>");
namespace tr = tpudist::tpu_runtime;
namespace dist = tpudist::distributed;

// The names of RankInfo's Python properties, which info[name] also reads
// (the dict that rank_info() returned before RankInfo was a type).
constexpr const char* kRankInfoKeys[] = {
    "rank", "world_size", "local_rank", "local_world_size", "host_index", "num_hosts",
    "slice_index", "num_slices", "megascale_coordinator", "master_addr", "master_port", "hostnames", "slicebuilder_addresses", "accelerator_type",
    "chip_topology", "devices_per_host", "source", "restart_count", "job_id", "summary"};

// tpu_dist.RankInfo: tpu_runtime::RankInfo, read-only.
void BindRankInfo(py::module_& m) {
  using tr::RankInfo;
  py::class_<RankInfo>(m, "RankInfo",
                       R"(This process's place in the job (tpu_runtime/rank_info.h), as discovery
found it (`tpu_dist.rank_info()`). Read-only; `info["rank"]` reads `info.rank`.
Pass it to ProcessGroupTpuDist(info=...) so that the group takes its host placement
and job id from it instead of the environment.)")
      .def_readonly("rank", &RankInfo::rank)
      .def_readonly("world_size", &RankInfo::world_size)
      .def_readonly("local_rank", &RankInfo::local_rank)
      .def_readonly("local_world_size", &RankInfo::local_world_size)
      .def_readonly("host_index", &RankInfo::host_index)
      .def_readonly("num_hosts", &RankInfo::num_hosts)
      .def_readonly("slice_index", &RankInfo::slice_index)
      .def_readonly("num_slices", &RankInfo::num_slices)
      .def_readonly("megascale_coordinator", &RankInfo::megascale_coordinator)
      .def_property_readonly("devices_per_slice", &RankInfo::devices_per_slice)
      .def_property_readonly("rank_in_slice", &RankInfo::rank_in_slice)
      .def_property_readonly("host_in_slice", &RankInfo::host_in_slice)
      .def_property_readonly("hostname", &RankInfo::hostname)
      .def_readonly("master_addr", &RankInfo::master_addr)
      .def_readonly("master_port", &RankInfo::master_port)
      .def_readonly("hostnames", &RankInfo::hostnames)
      .def_readonly("slicebuilder_addresses", &RankInfo::slicebuilder_addresses)
      .def_property_readonly("accelerator_type",
                             [](const RankInfo& i) { return i.slice.accelerator_type; })
      .def_property_readonly("chip_topology",
                             [](const RankInfo& i) { return i.slice.chip_topology; })
      .def_property_readonly("devices_per_host",
                             [](const RankInfo& i) { return i.slice.devices_per_host; })
      .def_property_readonly(
          "source", [](const RankInfo& i) { return std::string(tr::DiscoverySourceName(i.source)); })
      .def_readonly("restart_count", &RankInfo::restart_count)
      .def_readonly("job_id", &RankInfo::job_id)
      .def_property_readonly("summary", [](const RankInfo& i) { return tr::ToString(i); })
      .def_static("keys", [] {
        std::vector<std::string> keys(std::begin(kRankInfoKeys), std::end(kRankInfoKeys));
        return keys;
      }, "The property names, in the order of the file comment of tpu_runtime/rank_info.h.")
      .def("__getitem__",
           [](const py::object& self, const std::string& key) -> py::object {
             for (const char* k : kRankInfoKeys) {
               if (key == k) return self.attr(k);
             }
             throw py::key_error(key);
           })
      .def("__eq__", [](const RankInfo& a, const RankInfo& b) { return a == b; })
      .def("__repr__", [](const RankInfo& i) { return "RankInfo(" + tr::ToString(i) + ")"; });
}

using BackendOptions = ProcessGroupTpuDist::BackendOptions;

// The groups this module made (ProcessGroupTpuDist(...) from Python), by weak
// reference, for the interpreter-exit hook. Groups C++ made from them
// (split_group) reach the hook through torch's group map instead
// (tpu_dist/__init__.py). The module lives as long as the interpreter; the
// list is never destroyed (used at exit).
class GroupsMadeHere {
 public:
  void Add(const c10::intrusive_ptr<ProcessGroupTpuDist>& group) {
    std::lock_guard<std::mutex> lock(mu_);
    // Forget the destroyed ones, so that a loop of groups does not grow it.
    groups_.erase(std::remove_if(groups_.begin(), groups_.end(),
                                 [](const c10::weak_intrusive_ptr<ProcessGroupTpuDist>& g) {
                                   return g.expired();
                                 }),
                  groups_.end());
    groups_.emplace_back(group);
  }
  // The live ones (a reference each: none is destroyed while the caller
  // stops it).
  std::vector<c10::intrusive_ptr<ProcessGroupTpuDist>> Live() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<c10::intrusive_ptr<ProcessGroupTpuDist>> live;
    for (const c10::weak_intrusive_ptr<ProcessGroupTpuDist>& g : groups_) {
      if (c10::intrusive_ptr<ProcessGroupTpuDist> p = g.lock()) live.push_back(std::move(p));
    }
    return live;
  }

 private:
  std::mutex mu_;
  std::vector<c10::weak_intrusive_ptr<ProcessGroupTpuDist>> groups_;  // guarded by mu_
};

GroupsMadeHere& MadeHere() {
  static GroupsMadeHere* groups = new GroupsMadeHere();  // never destroyed: used at exit
  return *groups;
}

// The options a group made now would get from this process's environment
// (distributed/group_config.h); ValueError naming a malformed variable.
// With `info`, host placement and the job id come from it (not TPU_*).
ProcessGroupTpuDist::Options ResolvedOptions(const std::string& host_id, const std::string& job_id,
                                             const std::string& bind_address,
                                             const tr::RankInfo* info) {
  dist::GroupInitOptions o;
  o.host_id = host_id;
  o.job_id = job_id;
  o.bind_address = bind_address;
  o.store = c10::make_intrusive<c10d::HashStore>();  // never used: no TCPStore of our own
  absl::StatusOr<dist::GroupConfig> config = dist::ResolveGroupConfigFromProcess(info, o);
  if (!config.ok()) throw py::value_error(std::string(config.status().message()));
  return config->tpu_dist;
}

// A read-write property of BackendOptions::tpu_dist.
template <typename T, typename Class>
void TpuDistKnob(Class& c, const char* name, T ProcessGroupTpuDist::Options::*field,
                 const char* doc) {
  c.def_property(
      name, [field](const BackendOptions& o) { return o.tpu_dist.*field; },
      [field](BackendOptions& o, T v) { o.tpu_dist.*field = std::move(v); }, doc);
}

// ProcessGroupTpuDist.Options: what `Backend.options` returns (getBackendOptions)
// and what new_group / split_group take as pg_options. A subclass of torch's
// Backend.Options: `_timeout` and `group_name` are the base's.
void BindBackendOptions(py::handle scope) {
  py::class_<BackendOptions, c10d::Backend::Options, c10::intrusive_ptr<BackendOptions>> c(
      scope, "Options",
      R"(The tpu_dist group's options (docs/collectives.md, Options). Options(info=None) starts
from what a group made now would get from `info` (default: this process's RankInfo when
discovery finds one) and the environment (host id, job id, bind address, job secret,
TPU_DIST_* knobs); `Backend.options` returns those a group was
made with, with its current timeout and its group name.)");
  c.def(py::init([](const std::optional<tr::RankInfo>& info) {
          auto o = c10::make_intrusive<BackendOptions>();
          if (info.has_value()) {
            o->tpu_dist = ResolvedOptions("", "", "", &*info);
          } else {
            // What create_backend does: this process's RankInfo when discovery
            // finds one, else the environment's rule without it.
            absl::StatusOr<tr::RankInfo> found = tr::DiscoverRankInfo(tr::EnvMapFromProcess());
            o->tpu_dist = ResolvedOptions("", "", "", found.ok() ? &*found : nullptr);
          }
          o->timeout = o->tpu_dist.timeout;
          return o;
        }),
        py::arg("info") = py::none());
  TpuDistKnob(c, "host_id", &ProcessGroupTpuDist::Options::host_id,
              "ranks with equal host ids share memory; \"\" = this machine");
  TpuDistKnob(c, "job_id", &ProcessGroupTpuDist::Options::job_id, "part of shm segment names");
  TpuDistKnob(c, "bind_address", &ProcessGroupTpuDist::Options::bind_address,
              "address the inter-host TCP listeners bind");
  TpuDistKnob(c, "worker_hostname", &ProcessGroupTpuDist::Options::worker_hostname,
              "this host's entry of the slice's host list");
  TpuDistKnob(c, "shm_slot_bytes", &ProcessGroupTpuDist::Options::shm_slot_bytes,
              "bytes per shm slot (0: chosen per host)");
  TpuDistKnob(c, "shm_num_slots", &ProcessGroupTpuDist::Options::shm_num_slots,
              "shm slots per rank (0: chosen per host)");
  TpuDistKnob(c, "shm_assume_foreign_load", &ProcessGroupTpuDist::Options::shm_assume_foreign_load,
              "take the shm paths meant for busy cores on idle cores too");
  TpuDistKnob(c, "small_allreduce_bytes", &ProcessGroupTpuDist::Options::small_allreduce_bytes,
              "one-shot allreduce limit");
  TpuDistKnob(c, "multi_rail_min_bytes", &ProcessGroupTpuDist::Options::multi_rail_min_bytes,
              "across hosts: payloads from this size use every local rank's TCP rail");
  TpuDistKnob(c, "rail_chunk_bytes", &ProcessGroupTpuDist::Options::rail_chunk_bytes,
              "across hosts: chunk size of the multi-rail path");
  TpuDistKnob(c, "inline_max_bytes", &ProcessGroupTpuDist::Options::inline_max_bytes,
              "waited-on collectives up to this size run on the caller when idle (-1: never)");
  TpuDistKnob(c, "p2p_over_store", &ProcessGroupTpuDist::Options::p2p_over_store,
              "send/recv through the store");
  TpuDistKnob(c, "shm_p2p", &ProcessGroupTpuDist::Options::shm_p2p,
              "send/recv inside a host through shared memory (False: TCP)");
  c.def_property_readonly(
      "has_job_secret", [](const BackendOptions& o) { return !o.tpu_dist.job_secret.empty(); },
      "whether inter-host connections are authenticated (the secret itself is not exposed)");
  c.def_property_readonly(
      "wait_policy_is_set", [](const BackendOptions& o) { return o.tpu_dist.wait.has_value(); },
      "whether the shm wait back-off was chosen explicitly (else per host)");
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "tpu_dist c10d backend (shared memory inside a host, TCP between hosts)";
  // The base class must be registered before ours refers to it.
  py::module_::import("torch.distributed");
  BindRankInfo(m);

  py::class_<ProcessGroupTpuDist, c10d::Backend, GilFreeDestructorHolder<ProcessGroupTpuDist>>
      pg_class(m, "ProcessGroupTpuDist",
      R"(The tpu_dist backend. Construction is collective over `store`.

Args:
  store: a torch.distributed Store shared by the group's ranks.
  rank, size: this rank in the group and the group's size.
  timeout: per-op timeout (datetime.timedelta).
  group_name: namespaces the group's store keys and shm segments; unique per store.
  host_id: ranks with equal host ids share memory; "" = TPU_DIST_HOST_ID, else
    "slice_host_<info.host_index>" with `info`, else this machine.
  job_id: part of shm segment names; "" = TPU_DIST_JOB_ID or a random id.
  bind_address: address the inter-host TCP listeners bind; "" = TPU_DIST_BIND_ADDRESS,
    else derived (this host's entry of info.hostnames, ...).
The environment is read by the C++ rule every C++ binary uses
(distributed/group_config.h); the job secret comes from TPU_DIST_JOB_SECRET[_FILE].
A malformed variable raises ValueError naming it.

options: a ProcessGroupTpuDist.Options (torch's pg_options) whose knobs the group takes
  instead of the environment's; timeout and group_name are still the arguments'.
info: a RankInfo (tpu_dist.rank_info()): without options, host id ("slice_host_<host_index>"),
  job id and this host's name come from it (TPU_DIST_* still win). TPU_* variables are read
  by discovery only: without `info` the group knows no slice placement.)");
  BindBackendOptions(pg_class);
  pg_class
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const std::string& group_name,
                       const std::string& host_id, const std::string& job_id,
                       const std::string& bind_address,
                       const std::optional<c10::intrusive_ptr<BackendOptions>>& options,
                       const std::optional<tr::RankInfo>& info,
                       const std::vector<int64_t>& global_ranks) {
             ProcessGroupTpuDist::Options resolved;
             if (options.has_value() && *options) {
               resolved = (*options)->tpu_dist;  // the caller's knobs (pg_options)
             } else {
               resolved = ResolvedOptions(host_id, job_id, bind_address,
                                          info.has_value() ? &*info : nullptr);
             }
             resolved.timeout = timeout;
             resolved.group_name = group_name;
             resolved.global_ranks = global_ranks;
             auto group = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, size, resolved);
             MadeHere().Add(group);
             return GilFreeDestructorHolder<ProcessGroupTpuDist>(std::move(group));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("group_name") = "default", py::arg("host_id") = "",
           py::arg("job_id") = "", py::arg("bind_address") = "",
           py::arg("options") = py::none(), py::arg("info") = py::none(),
           py::arg("global_ranks") = std::vector<int64_t>(),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("num_hosts",
                             [](const ProcessGroupTpuDist& pg) {
                               return pg.host_layout().num_hosts();
                             })
      .def("status", [](const ProcessGroupTpuDist& pg) { return pg.status().ToString(); },
           "OK, or the error that poisoned the group.");

  m.def(
      "_stop_all_group_threads",
      [](const py::list& also) {
        // With the GIL: the groups, one reference each, without duplicates.
        std::vector<c10::intrusive_ptr<ProcessGroupTpuDist>> groups = MadeHere().Live();
        for (const py::handle& h : also) {
          auto* p = py::cast<ProcessGroupTpuDist*>(h);
          if (p == nullptr) continue;
          if (std::none_of(groups.begin(), groups.end(),
                           [p](const auto& g) { return g.get() == p; })) {
            groups.push_back(c10::intrusive_ptr<ProcessGroupTpuDist>::reclaim_copy(p));
          }
        }
        py::gil_scoped_release release;  // the references dropped here too
        int not_stopped = 0;
        for (const c10::intrusive_ptr<ProcessGroupTpuDist>& group : groups) {
          if (!group->StopThreads()) ++not_stopped;
        }
        groups.clear();
        return not_stopped;
      },
      py::arg("also") = py::list(),
      "Stops the op threads of every live group this module made, and of the groups in "
      "`also` (ProcessGroupTpuDist::StopThreads), and returns how many groups' threads "
      "did not stop. tpu_dist's atexit hook: a thread that frees a tensor takes the GIL, "
      "and one that does so while the interpreter finalizes is ended by pthread_exit, "
      "which aborts the process (SIGABRT).");

  m.def(
      "dump_flight_recorder",
      [](const std::string& prefix) {
        absl::StatusOr<std::vector<std::string>> paths =
            tpudist::collectives::DumpFlightRecorders(prefix, "on demand", /*quiet=*/true);
        if (!paths.ok()) throw std::runtime_error(paths.status().ToString());
        return *paths;
      },
      py::arg("prefix") = "", py::call_guard<py::gil_scoped_release>(),
      "Writes the flight recorder of every live tpu_dist group of this process to "
      "<prefix><global rank> (torch's format; '' = the configured location) and returns "
      "the paths.");
  m.def(
      "_flight_recorder_trace",
      [](const ProcessGroupTpuDist& pg) {
        std::string bytes;
        if (pg.flight_recorder()) {
          bytes = tpudist::collectives::FlightRecorderPickle({pg.flight_recorder()});
        }
        return py::bytes(bytes);
      },
      "The pickled dump (torch's format) of one group's flight recorder; b'' when off.");

  m.def(
      "rank_info",
      []() {
        absl::StatusOr<tr::RankInfo> info = tr::DiscoverRankInfo(tr::EnvMapFromProcess());
        if (!info.ok()) throw py::value_error(std::string(info.status().message()));
        return *std::move(info);
      },
      "This process's place in the job, discovered from the environment (KubeRay TPU "
      "webhook, TorchTPU, torchrun/Ray Train, MPI, SLURM); see docs/runtime.md.");
}
