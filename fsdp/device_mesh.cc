#include "fsdp/device_mesh.h"

#include <exception>
#include <numeric>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/exception_message.h"
#include "fsdp/mesh_math.h"

namespace tpudist::fsdp {

int64_t DeviceMesh::size() const { return MeshNumel(shape_); }

absl::StatusOr<int> DeviceMesh::DimIndex(absl::string_view name) const {
  for (int d = 0; d < ndim(); ++d) {
    if (d < static_cast<int>(dim_names_.size()) && dim_names_[d] == name) return d;
  }
  return absl::NotFoundError(absl::StrCat("device mesh has no dimension '", name,
                                          "'; its dimensions are (",
                                          absl::StrJoin(dim_names_, ", "), ")"));
}

absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> DeviceMesh::Group(
    absl::string_view name) const {
  absl::StatusOr<int> d = DimIndex(name);
  if (!d.ok()) return d.status();
  return groups_[*d];
}

absl::StatusOr<DeviceMesh> DeviceMesh::Slice(absl::string_view name) const {
  const std::string names[] = {std::string(name)};
  return Slice(names);
}

absl::StatusOr<DeviceMesh> DeviceMesh::Slice(absl::Span<const std::string> names) const {
  if (names.empty()) return absl::InvalidArgumentError("cannot slice a device mesh to no dims");
  std::vector<int> keep;
  for (const std::string& name : names) {
    absl::StatusOr<int> d = DimIndex(name);
    if (!d.ok()) return d.status();
    for (int k : keep) {
      if (k == *d) {
        return absl::InvalidArgumentError(
            absl::StrCat("device mesh dimension '", name, "' requested twice in a slice"));
      }
    }
    keep.push_back(*d);
  }
  DeviceMesh sub;
  sub.device_type_ = device_type_;
  sub.global_rank_ = global_rank_;
  sub.timeout_ = timeout_;
  sub.ranks_ = SubMeshRanks(shape_, ranks_, coordinate_, keep);
  for (int d : keep) {
    sub.shape_.push_back(shape_[d]);
    sub.dim_names_.push_back(dim_names_[d]);
    sub.coordinate_.push_back(coordinate_[d]);
    sub.groups_.push_back(groups_[d]);
  }
  return sub;
}

std::string DeviceMesh::ToString() const {
  std::vector<std::string> dims;
  for (int d = 0; d < ndim(); ++d) {
    dims.push_back(d < static_cast<int>(dim_names_.size())
                       ? absl::StrCat(dim_names_[d], "=", shape_[d])
                       : absl::StrCat(shape_[d]));
  }
  return absl::StrCat("DeviceMesh(", device_type_, ", (", absl::StrJoin(dims, ", "), "), rank ",
                      global_rank_, " at (", absl::StrJoin(coordinate_, ", "), "))");
}

absl::StatusOr<DeviceMesh> InitDeviceMesh(absl::string_view device_type,
                                          std::vector<int64_t> shape,
                                          std::vector<std::string> dim_names,
                                          const DeviceMeshEnv& env) {
  absl::Status valid = ValidateMeshShape(shape, dim_names, env.world_size);
  if (!valid.ok()) return valid;
  if (env.rank < 0 || env.rank >= env.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", env.rank, " is outside a world of ", env.world_size));
  }
  if (!env.store) return absl::InvalidArgumentError("DeviceMeshEnv.store is null");
  if (!env.group_factory) return absl::InvalidArgumentError("DeviceMeshEnv.group_factory is empty");

  DeviceMesh mesh;
  mesh.device_type_ = std::string(device_type);
  mesh.shape_ = std::move(shape);
  mesh.dim_names_ = std::move(dim_names);
  mesh.ranks_.resize(env.world_size);
  std::iota(mesh.ranks_.begin(), mesh.ranks_.end(), 0);
  mesh.global_rank_ = env.rank;
  mesh.timeout_ = env.collective_timeout;
  mesh.coordinate_ = UnravelIndex(mesh.shape_, env.rank);
  for (int d = 0; d < mesh.ndim(); ++d) {
    const int keep[] = {d};
    const std::vector<int> members = SubMeshRanks(mesh.shape_, mesh.ranks_, mesh.coordinate_, keep);
    const std::string prefix =
        absl::StrCat(env.mesh_name, "/dim", d, "/", absl::StrJoin(members, "-"));
    auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, env.store);
    const int group_rank = static_cast<int>(mesh.coordinate_[d]);
    absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> group;
    try {
      group = env.group_factory(store, group_rank, members);
    } catch (const std::exception& e) {
      group = absl::InternalError(::tpudist::collectives::ExceptionMessage(e));
    }
    if (!group.ok() || !*group) {
      return absl::Status(
          group.ok() ? absl::StatusCode::kInternal : group.status().code(),
          absl::StrCat("rank ", env.rank, ": creating the process group of mesh dim ", d,
                       " (ranks ", absl::StrJoin(members, ", "), ") failed: ",
                       group.ok() ? "factory returned null" : group.status().message()));
    }
    mesh.groups_.push_back(*group);
  }
  return mesh;
}

absl::StatusOr<std::vector<int64_t>> DpTpShapeForSlice(const tpu_runtime::SliceSpec& slice,
                                                        int64_t tp) {
  const int64_t devices = slice.num_devices();
  const int64_t per_host = slice.devices_per_host;
  if (tp < 1 || per_host < 1 || per_host % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tp=", tp, " must divide the ", per_host, " devices per host of the ",
        slice.accelerator_type, " slice (", slice.num_hosts, " hosts x ", per_host,
        ") so that every tp group stays inside one host"));
  }
  return std::vector<int64_t>{devices / tp, tp};
}

absl::StatusOr<DeviceMesh> InitDeviceMeshForSlice(absl::string_view device_type,
                                                  const tpu_runtime::SliceSpec& slice,
                                                  int64_t tp, const DeviceMeshEnv& env) {
  absl::StatusOr<std::vector<int64_t>> shape = DpTpShapeForSlice(slice, tp);
  if (!shape.ok()) return shape.status();
  return InitDeviceMesh(device_type, *shape, {"dp", "tp"}, env);
}

}  // namespace tpudist::fsdp
