// parse-prometheus-text-format.d.ts: the shape of what the Prometheus text parser returns (it ships no types).

declare module "parse-prometheus-text-format" {
  interface Sample {
    value?: string;
    labels?: Record<string, string>;
    buckets?: Record<string, string>;
    count?: string;
    sum?: string;
  }
  interface Family {
    name: string;
    help: string;
    type: "COUNTER" | "GAUGE" | "HISTOGRAM" | "SUMMARY" | "UNTYPED";
    metrics: Sample[];
  }
  export default function parsePrometheusTextFormat(text: string): Family[];
}
