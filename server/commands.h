// The subcommands of the `thetaserve` program. Each takes its arguments after the subcommand
// name and returns the process exit code.
#pragma once

#include <string>
#include <vector>

namespace thetaserve::server {

int RunGenerate(const std::vector<std::string>& args);
int RunEval(const std::vector<std::string>& args);
int RunServe(const std::vector<std::string>& args);
int RunClient(const std::vector<std::string>& args);
int RunCalibrate(const std::vector<std::string>& args);
int RunHealth(const std::vector<std::string>& args);
int RunStatus(const std::vector<std::string>& args);

}  // namespace thetaserve::server
