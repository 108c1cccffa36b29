"""Where bytes lie: paths and URLs to filesystems, atomic publish, Delta tables, the lake's coverage."""
