// Reads files of tests/agent/testdata (path compiled in as ORION_AGENT_TESTDATA).
#pragma once

#include <fstream>
#include <sstream>
#include <string>

namespace orion::agent::testing {

inline std::string ReadTestdata(const std::string& name) {
  std::ifstream in(std::string(ORION_AGENT_TESTDATA) + "/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace orion::agent::testing
