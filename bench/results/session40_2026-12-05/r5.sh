#!/usr/bin/env bash
# Session 40 round 5: round 4 again, keeping only ncu's details pages and per-region stalls
# (the device returns a limited number of files).
bash _wheels/s40r4.sh > /dev/null 2>&1
cd $OUT && for f in *.txt; do case $f in *regions.txt) ;; *) grep -E "Duration|Throughput|Ipc|Issue Slots|Eligible|Warp Cycles|Stall|stall|Conflicts|Registers|Active Warps|Theoretical Occ|Achieved Occ|Executed Instructions  " $f > ${f%.txt}.key ;; esac; done
for f in *.regions.txt; do echo "== $f"; cat $f; done > regions_all.txt
for f in *.key; do echo "== $f"; cat $f; done > details_all.txt
mkdir -p keep && mv regions_all.txt details_all.txt keep/ && rm -f ./*.* && mv keep/* . && rmdir keep; ls; head -c 3000 details_all.txt
