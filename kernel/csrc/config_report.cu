// Host program: prints the tile configurations' launch resources as JSON (no GPU needed).
#include <cstdio>

#include "verify_attention_sm90.cuh"

template <class Cfg>
void print(const char* name, bool last) {
  std::printf("  \"%s\": {\"rows_per_cta\": %d, \"block_n\": %d, \"stages\": %d, \"threads\": %d, "
              "\"dynamic_smem_bytes\": %d}%s\n",
              name, Cfg::kM, Cfg::kBlockN, Cfg::kStages, Cfg::kThreads, Cfg::kSmemBytes, last ? "" : ",");
}

int main() {
  std::printf("{\n");
  print<va::ConfigLarge>("large", false);
  print<va::ConfigSmall>("small", false);
  print<va::ConfigWgmma>("wgmma", false);
  print<va::ConfigWgmmaWs>("wgmma-ws", true);
  std::printf("}\n");
  return 0;
}
