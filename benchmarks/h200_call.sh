# One device call (2026-11-30, fifth session, eighth): does the H200's Vulkan adapter offer
# wgpu-native's experimental cooperative-matrix feature (tensor cores from WGSL)?
python3 -c "
import wgpu
for a in wgpu.gpu.enumerate_adapters_sync():
    print(a.summary, '|', 'cooperative-matrix' in a.features, '|', sorted(f for f in a.features if 'subgroup' in f or 'coop' in f or 'f16' in f))
"
