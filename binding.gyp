# node-gyp entry point for tools that expect one. It holds no sources: its only action builds through
# CMakeLists.txt (scripts/gyp-cmake.mjs runs cmake-js), the project's one build description.
{
  "targets": [
    {
      "target_name": "nodetron",
      "type": "none",
      "actions": [
        {
          "action_name": "cmake_js_build",
          "inputs": ["<(module_root_dir)/CMakeLists.txt"],
          "outputs": ["<(module_root_dir)/build/Release/nodetron.node"],
          "action": ["node", "<(module_root_dir)/scripts/gyp-cmake.mjs"]
        }
      ]
    }
  ]
}
