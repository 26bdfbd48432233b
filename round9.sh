export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
xz -dc _devbuild/ours.so.xz > gproj_cuda/_C.cpython-312-x86_64-linux-gnu.so
FA3=$PWD/_wheels/fa3; xz -dc $FA3/flash_attn_3/_C.abi3.so.xz > $FA3/flash_attn_3/_C.abi3.so
rm -rf $OUT/*; mkdir -p $OUT/r; O=$OUT/r
PYTHONPATH=$FA3:$PYTHONPATH timeout 330 python3 bench/speed.py --impls gproj_cuda/gproj,gproj_cuda/fa3,sdpa_cudnn,sdpa_flash,fa3 --budget-s 0.2 --pause 0.05 --rounds 3 --out $O/speed.json --md $O/speed.md --plot $O/speed.png > $O/speed_log.txt 2>&1; tail -2 $O/speed_log.txt
timeout 200 python3 bench/train_step.py --rounds 2 --steps 10 --out $O/train_step.json --md $O/train_step.md > $O/train_log.txt 2>&1; tail -5 $O/train_step.md
cd $OUT && tar czf res.tgz r && rm -rf r
