"""Where bytes lie: paths and URLs to filesystems, atomic publish, the lake's layout and manifests."""
