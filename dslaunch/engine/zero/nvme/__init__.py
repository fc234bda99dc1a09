"""ZeRO-Infinity: optimizer states, fp32 masters and stage 3 parameters kept on an NVMe drive."""
