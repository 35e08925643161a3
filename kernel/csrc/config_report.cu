// Host program: prints the tile configurations' launch resources as JSON (no GPU needed).
//   config_report                    the configurations
//   config_report rule ROWS KEYS SMS  the config `auto` takes on a part that runs the mma.sync
//                                     kernels in 99 KB (sm_120): "small" or "small-m32"
//   config_report wgmma-rule ROWS B   the config `auto` takes on an H100/H200 for ROWS rows
//                                     (tokens x heads) in B requests: "wgmma-ws" or "wgmma-ws-pipe"
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "verify_attention_sm90.cuh"

template <class Cfg>
void print(const char* name, bool last) {
  std::printf("  \"%s\": {\"rows_per_cta\": %d, \"block_n\": %d, \"stages\": %d, \"threads\": %d, "
              "\"dynamic_smem_bytes\": %d}%s\n",
              name, Cfg::kM, Cfg::kBlockN, Cfg::kStages, Cfg::kThreads, Cfg::kSmemBytes, last ? "" : ",");
}

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "rule") == 0) {
    const bool m32 = va::prefer_small_m32(std::atoll(argv[2]), std::atoll(argv[3]), std::atoi(argv[4]));
    std::printf("%s\n", m32 ? "small-m32" : "small");
    return 0;
  }
  if (argc == 4 && std::strcmp(argv[1], "wgmma-rule") == 0) {
    const bool pipe = va::wgmma_ws_pipelined(std::atoll(argv[2]), std::atoi(argv[3]));
    std::printf("%s\n", pipe ? "wgmma-ws-pipe" : "wgmma-ws");
    return 0;
  }
  std::printf("{\n");
  print<va::ConfigLarge>("large", false);
  print<va::ConfigSmall>("small", false);
  print<va::ConfigSmallM32>("small-m32", false);
  print<va::ConfigWgmma>("wgmma", false);
  print<va::ConfigWgmmaWs>("wgmma-ws", false);
  print<va::ConfigWgmmaWsPipe>("wgmma-ws-pipe", true);
  std::printf("}\n");
  return 0;
}
