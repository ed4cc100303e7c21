// Loading a model and a backend for the command-line tools, with a progress line.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/model.h"

namespace thetaserve::server {

struct LoadedModel {
  std::unique_ptr<model::Model> model;
  std::unique_ptr<kernels::Backend> backend;
};

absl::StatusOr<kernels::Device> ParseDevice(const std::string& name);

// Loads `path`, prints "loading <path> ..." and a summary line to stderr.
absl::StatusOr<LoadedModel> LoadModelForCli(const std::string& path, kernels::Device device,
                                            int threads);

}  // namespace thetaserve::server
