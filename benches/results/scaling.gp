set terminal pngcairo size 1500,620 font 'DejaVu Sans,11'
set output 'benches/results/scaling.png'
set multiplot layout 1,2 title 'sse-gateway load harness: scaling (2 cores shared by client, upstream and proxy)'
set logscale x; set grid; set key top left; set xrange [0.7:14000]
set xlabel 'concurrent streams'
set logscale y; set ylabel 'per-event latency, upstream send to client receive (µs)'
set title 'Latency: p50 solid, p99 dashed (offered: 100 ev/s per stream, at most 10k ev/s in all)'
plot 'benches/results/scaling.dat' u 1:2 w lp lw 2 pt 7 lc 1 dt 1 t 'direct p50', 'benches/results/scaling.dat' u 1:3 w lp lw 2 pt 6 lc 1 dt 2 t 'direct p99', 'benches/results/scaling.dat' u 1:5 w lp lw 2 pt 7 lc 2 dt 1 t 'nginx p50', 'benches/results/scaling.dat' u 1:6 w lp lw 2 pt 6 lc 2 dt 2 t 'nginx p99', 'benches/results/scaling.dat' u 1:8 w lp lw 2 pt 7 lc 3 dt 1 t 'gateway p50', 'benches/results/scaling.dat' u 1:9 w lp lw 2 pt 6 lc 3 dt 2 t 'gateway p99', 'benches/results/scaling.dat' u 1:11 w lp lw 2 pt 7 lc 4 dt 1 t 'gateway-pass p50', 'benches/results/scaling.dat' u 1:12 w lp lw 2 pt 6 lc 4 dt 2 t 'gateway-pass p99'
set ylabel 'events/s delivered at saturation'; set logscale y; set key bottom left
set title 'Throughput at saturation (all processes share 2 cores)'
plot 'benches/results/scaling.dat' u 1:4 w lp lw 2 pt 7 lc 1 t 'direct', 'benches/results/scaling.dat' u 1:7 w lp lw 2 pt 7 lc 2 t 'nginx', 'benches/results/scaling.dat' u 1:10 w lp lw 2 pt 7 lc 3 t 'gateway', 'benches/results/scaling.dat' u 1:13 w lp lw 2 pt 7 lc 4 t 'gateway-pass'
unset multiplot
