// Command pepsi-example is a stage program in Go: it serves the example
// pipeline's parse, enrich and deliver stages (see package pipeline), with tag
// fused into enrich's pass. pepsi-dispatch starts it as "pepsi-example worker
// [-c FILE]" with PEPSI_STAGE naming the stage.
package main

import (
	"github.com/pepsi-pipeline/pepsi/examples/pepsi-example/pipeline"
	"github.com/pepsi-pipeline/pepsi/stage"
)

func main() {
	stage.Main(pipeline.Handlers(), stage.Fuse(pipeline.Fused...))
}
