// Command-line options shared by generate, eval, calibrate and serve for Top-θ and the
// sparse V policy, and the loading of a θ file against a model.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/sequence_kv.h"
#include "kernels/top_theta.h"
#include "model/model.h"
#include "model/theta_table.h"
#include "server/cli_args.h"

namespace thetaserve::server {

// Flags: --theta FILE --sdc none|exact|exp-threshold|offline --no-vmc --exact-top-k
// --policy full|sparse|offload --local-window N --sink-tokens N --obs-window N --retain-factor X
// --keep-fraction F
std::vector<std::pair<std::string, bool>> ThetaFlags();
extern const char kThetaUsage[];

struct ThetaOptions {
  std::unique_ptr<model::ThetaTable> table;  // null: dense attention
  kernels::TopThetaConfig config;            // points into `table`
  cache::SparsePolicy sparse;  // enabled under sparse and offload
  std::string policy = "full";  // "full", "sparse", "offload"
  std::string theta_path;       // --theta; empty: dense attention
  std::string mode() const;  // "dense", "top-theta-pre", "top-theta-post", "top-k"
};

// Three steps, so that each mistake shows before the slow part it would spoil:
// ParseThetaOptions reads the flags (a bad value is a bad command line); LoadThetaFile reads the
// θ file they name, before the model loads (it does nothing without --theta); CheckThetaForModel
// holds the file against the loaded model (a file calibrated for another model is an
// INVALID_ARGUMENT that names both fingerprints).
// `more_v_store_flags`: flags of the V store that only the calling command takes (serve's
// --fixed-compaction), refused without a V-store policy as the shared ones are.
absl::StatusOr<ThetaOptions> ParseThetaOptions(
    const CliArgs& args, std::initializer_list<const char*> more_v_store_flags = {});
absl::Status LoadThetaFile(ThetaOptions& options);
absl::Status CheckThetaForModel(const ThetaOptions& options, const model::Model& model);

}  // namespace thetaserve::server
