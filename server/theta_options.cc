#include "server/theta_options.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace thetaserve::server {

const char kThetaUsage[] =
    "  --theta FILE          Top-θ thresholds from `thetaserve calibrate` (default: dense)\n"
    "  --sdc MODE            softmax-denominator compensation: exact (default), exp-threshold,\n"
    "                        offline, none\n"
    "  --no-vmc              no V-mean compensation\n"
    "  --exact-top-k         exact top-k per row (k from the θ file) instead of θ (baseline)\n"
    "  --policy full|sparse|offload\n"
    "                        V store: full keeps every row (savings are rows read); sparse\n"
    "                        drops rows attention did not retain; offload moves them to host\n"
    "                        memory instead, where attention still reads them (default full;\n"
    "                        the flags below marked sparse apply to offload too)\n"
    "  --local-window N      sparse: recent rows always kept dense (default 256)\n"
    "  --sink-tokens N       sparse: first rows always kept (default 4)\n"
    "  --obs-window N        sparse: a row leaving the tail is kept when one of the last N\n"
    "                        queries retained it (default 32)\n"
    "  --retain-factor X     sparse: only rows kept with margin (e > X·θ) count as retained\n"
    "                        for the V store (default 1: every kept row)\n"
    "  --keep-fraction F     sparse: instead of the obs-window rule, keep the fraction F of the\n"
    "                        rows leaving the tail with the highest mean retained probability\n"
    "                        (a budget)\n";

std::vector<std::pair<std::string, bool>> ThetaFlags() {
  return {{"theta", true},       {"sdc", true},        {"no-vmc", false},
          {"exact-top-k", false}, {"policy", true},     {"local-window", true},
          {"sink-tokens", true},  {"obs-window", true}, {"retain-factor", true},
          {"keep-fraction", true}};
}

std::string ThetaOptions::mode() const {
  if (!table) return "dense";
  if (config.top_k) return "top-k";
  return absl::StrCat("top-theta-", model::PlacementName(table->placement));
}

absl::StatusOr<ThetaOptions> ParseThetaOptions(const CliArgs& args,
                                               std::initializer_list<const char*> more_v_store_flags) {
  ThetaOptions out;
  const std::string sdc = args.GetString("sdc", "exact");
  if (sdc == "exact") out.config.sdc = kernels::SdcMode::kExact;
  else if (sdc == "exp-threshold") out.config.sdc = kernels::SdcMode::kExpThreshold;
  else if (sdc == "offline") out.config.sdc = kernels::SdcMode::kOffline;
  else if (sdc == "none") out.config.sdc = kernels::SdcMode::kNone;
  else return absl::InvalidArgumentError(absl::StrCat("--sdc must be exact, exp-threshold, offline or none, got '", sdc, "'"));
  out.config.vmc = !args.Has("no-vmc");
  out.config.top_k = args.Has("exact-top-k");

  out.policy = args.GetString("policy", "full");
  if (out.policy != "full" && out.policy != "sparse" && out.policy != "offload") {
    return absl::InvalidArgumentError(
        absl::StrCat("--policy must be full, sparse or offload, got '", out.policy, "'"));
  }
  auto lw = args.GetInt("local-window", 256, 1, kMaxCountFlag);
  auto sink = args.GetInt("sink-tokens", 4, 0, kMaxCountFlag);
  auto obs = args.GetInt("obs-window", 32, 1, kMaxCountFlag);
  for (const auto* st : {&lw, &sink, &obs}) {
    if (!st->ok()) return st->status();
  }
  out.sparse.enabled = out.policy == "sparse" || out.policy == "offload";
  out.sparse.offload = out.policy == "offload";
  out.sparse.local_window = static_cast<int32_t>(*lw);
  out.sparse.sink_tokens = static_cast<int32_t>(*sink);
  out.sparse.obs_window = static_cast<int32_t>(*obs);
  auto retain = args.GetDouble("retain-factor", 1.0);
  if (!retain.ok()) return retain.status();
  if (!(*retain >= 1.0) || !std::isfinite(*retain)) {
    return absl::InvalidArgumentError(absl::StrCat("--retain-factor must be a finite number >= 1, got ",
                                                   args.GetString("retain-factor")));
  }
  out.config.retain_factor = static_cast<float>(*retain);
  auto keep = args.GetDouble("keep-fraction", 0.0);
  if (!keep.ok()) return keep.status();
  if (args.Has("keep-fraction") && !(*keep > 0.0 && *keep <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("--keep-fraction must be in (0, 1], got ",
                                                   args.GetString("keep-fraction")));
  }
  out.sparse.keep_fraction = *keep;
  // The V store's flags under --policy full did nothing, silently (and eval's report named a
  // keep_fraction it had not used): most likely the policy was forgotten.
  if (!out.sparse.enabled) {
    std::vector<const char*> flags = {"local-window", "sink-tokens", "obs-window",
                                      "retain-factor", "keep-fraction"};
    flags.insert(flags.end(), more_v_store_flags);
    for (const char* flag : flags) {
      if (args.Has(flag)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", flag, " applies to --policy sparse or offload (the V store); the policy is ",
            out.policy));
      }
    }
  }

  out.theta_path = args.GetString("theta");
  if (args.Has("theta") && out.theta_path.empty()) {
    return absl::InvalidArgumentError("--theta needs a file (from `thetaserve calibrate`)");
  }
  if (out.theta_path.empty()) {
    if (out.config.top_k) {
      return absl::InvalidArgumentError(
          "--exact-top-k needs --theta (its k per layer comes from the θ file)");
    }
    if (out.sparse.enabled) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--policy ", out.policy, " needs --theta (dense attention retains every row)"));
    }
    // Compensation applies to rows Top-θ drops, so without a θ file these do nothing. Said
    // rather than refused: a deployment that sets them once and turns Top-θ on and off by the
    // θ file alone (as the chart's config allows) keeps starting.
    for (const char* flag : {"sdc", "no-vmc"}) {
      if (args.Has(flag)) {
        std::fprintf(stderr,
                     "warning: --%s applies to Top-θ (--theta); without a θ file attention is "
                     "dense and it does nothing\n",
                     flag);
      }
    }
  }
  return out;
}

absl::Status LoadThetaFile(ThetaOptions& options) {
  if (options.theta_path.empty()) return absl::OkStatus();
  auto table = model::ThetaTable::Load(options.theta_path);
  if (!table.ok()) return table.status();
  // A table without one calibrated bucket (every layer's k at or past the calibration's
  // context) is legal and runs attention dense: said, since it is rarely what was meant.
  if (!table->AnyCalibrated()) {
    std::fprintf(stderr,
                 "warning: %s has no calibrated θ (every bucket is null): attention runs dense\n",
                 options.theta_path.c_str());
  }
  options.table = std::make_unique<model::ThetaTable>(std::move(*table));
  options.config.table = options.table.get();
  return absl::OkStatus();
}

absl::Status CheckThetaForModel(const ThetaOptions& options, const model::Model& model) {
  if (!options.table) return absl::OkStatus();
  const model::ThetaTable& table = *options.table;
  const auto& c = model.config();
  if (table.num_layers() != c.num_layers || table.num_heads() != c.num_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "θ file ", options.theta_path, " holds ", table.num_layers(), " layers × ",
        table.num_heads(), " heads; this model has ", c.num_layers, " × ", c.num_heads,
        "; calibrate it with `thetaserve calibrate`"));
  }
  if (table.model_fingerprint != model.fingerprint()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "θ file ", options.theta_path, " was calibrated for model '", table.model_name,
        "' (fingerprint ", table.model_fingerprint, "), not for this model '", c.name,
        "' (fingerprint ", model.fingerprint(), "); calibrate it with `thetaserve calibrate`"));
  }
  return absl::OkStatus();
}

}  // namespace thetaserve::server
