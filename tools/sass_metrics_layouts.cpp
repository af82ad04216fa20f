// Layouts of cupti_sass_metrics.h as g++ sees them, printed as JSON for tests/unit/data/cupti_sass_metrics_layouts.json.
//   g++ -I<cupti include dir> -I<cuda include dir> tools/sass_metrics_layouts.cpp -o /tmp/l && /tmp/l
// Run on the CUPTI 12.9, 13.0 and 13.1 headers: the output was identical.
#include <cstddef>
#include <cstdio>
#include <cupti_sass_metrics.h>

static bool first_struct = true, first_field = true;
#define BEGIN(T) printf("%s\n  \"%s\": {\"sizeof\": %zu, \"fields\": [", first_struct ? "{" : ",", #T, sizeof(T)); \
    first_struct = false; first_field = true;
#define F(T, f) printf("%s[%zu, %zu, \"%s\"]", first_field ? "" : ", ", offsetof(T, f), sizeof(((T*)0)->f), #f); \
    first_field = false;
#define END(size) printf("], \"struct_size\": %zu}", (size_t)(size));
#define END_NONE printf("], \"struct_size\": null}");

int main() {
    BEGIN(CUpti_SassMetrics_MetricDetails) F(CUpti_SassMetrics_MetricDetails, metricId)
    F(CUpti_SassMetrics_MetricDetails, pMetricName) F(CUpti_SassMetrics_MetricDetails, pMetricDescription) END_NONE
    BEGIN(CUpti_SassMetrics_GetNumOfMetrics_Params) F(CUpti_SassMetrics_GetNumOfMetrics_Params, structSize)
    F(CUpti_SassMetrics_GetNumOfMetrics_Params, pPriv) F(CUpti_SassMetrics_GetNumOfMetrics_Params, pChipName)
    F(CUpti_SassMetrics_GetNumOfMetrics_Params, numOfMetrics) END(CUpti_SassMetrics_GetNumOfMetrics_Params_STRUCT_SIZE)
    BEGIN(CUpti_SassMetrics_GetMetrics_Params) F(CUpti_SassMetrics_GetMetrics_Params, structSize)
    F(CUpti_SassMetrics_GetMetrics_Params, pPriv) F(CUpti_SassMetrics_GetMetrics_Params, pChipName)
    F(CUpti_SassMetrics_GetMetrics_Params, numOfMetrics) F(CUpti_SassMetrics_GetMetrics_Params, pMetricsList)
    END(CUpti_SassMetrics_GetMetrics_Params_STRUCT_SIZE)
    BEGIN(CUpti_SassMetrics_GetProperties_Params) F(CUpti_SassMetrics_GetProperties_Params, structSize)
    F(CUpti_SassMetrics_GetProperties_Params, pPriv) F(CUpti_SassMetrics_GetProperties_Params, pChipName)
    F(CUpti_SassMetrics_GetProperties_Params, pMetricName) F(CUpti_SassMetrics_GetProperties_Params, metric)
    END(CUpti_SassMetrics_GetProperties_Params_STRUCT_SIZE)
    BEGIN(CUpti_SassMetrics_Config) F(CUpti_SassMetrics_Config, metricId) F(CUpti_SassMetrics_Config, outputGranularity)
    END_NONE
    BEGIN(CUpti_SassMetricsSetConfig_Params) F(CUpti_SassMetricsSetConfig_Params, structSize)
    F(CUpti_SassMetricsSetConfig_Params, pPriv) F(CUpti_SassMetricsSetConfig_Params, numOfMetricConfig)
    F(CUpti_SassMetricsSetConfig_Params, pConfigs) F(CUpti_SassMetricsSetConfig_Params, deviceIndex)
    END(CUpti_SassMetricsSetConfig_Params_STRUCT_SIZE)
    BEGIN(CUpti_SassMetricsUnsetConfig_Params) F(CUpti_SassMetricsUnsetConfig_Params, structSize)
    F(CUpti_SassMetricsUnsetConfig_Params, pPriv) F(CUpti_SassMetricsUnsetConfig_Params, deviceIndex)
    END(CUpti_SassMetricsUnsetConfig_Params_STRUCT_SIZE)
    BEGIN(CUpti_SassMetricsEnable_Params) F(CUpti_SassMetricsEnable_Params, structSize)
    F(CUpti_SassMetricsEnable_Params, pPriv) F(CUpti_SassMetricsEnable_Params, ctx)
    F(CUpti_SassMetricsEnable_Params, enableLazyPatching) END(CUpti_SassMetricsEnable_Params_STRUCT_SIZE)
    BEGIN(CUpti_SassMetricsDisable_Params) F(CUpti_SassMetricsDisable_Params, structSize)
    F(CUpti_SassMetricsDisable_Params, pPriv) F(CUpti_SassMetricsDisable_Params, ctx)
    F(CUpti_SassMetricsDisable_Params, numOfDroppedRecords) END(CUpti_SassMetricsDisable_Params_STRUCT_SIZE)
    BEGIN(CUpti_SassMetricsGetDataProperties_Params) F(CUpti_SassMetricsGetDataProperties_Params, structSize)
    F(CUpti_SassMetricsGetDataProperties_Params, pPriv) F(CUpti_SassMetricsGetDataProperties_Params, ctx)
    F(CUpti_SassMetricsGetDataProperties_Params, numOfPatchedInstructionRecords)
    F(CUpti_SassMetricsGetDataProperties_Params, numOfInstances) END(CUpti_SassMetricsGetDataProperties_Params_STRUCT_SIZE)
    BEGIN(CUpti_SassMetrics_InstanceValue) F(CUpti_SassMetrics_InstanceValue, metricId)
    F(CUpti_SassMetrics_InstanceValue, value) END(CUpti_SassMetrics_InstanceValue_STRUCT_SIZE)
    BEGIN(CUpti_SassMetrics_Data) F(CUpti_SassMetrics_Data, structSize) F(CUpti_SassMetrics_Data, pPriv)
    F(CUpti_SassMetrics_Data, cubinCrc) F(CUpti_SassMetrics_Data, functionIndex) F(CUpti_SassMetrics_Data, functionName)
    F(CUpti_SassMetrics_Data, pcOffset) F(CUpti_SassMetrics_Data, pInstanceValues) END_NONE
    BEGIN(CUpti_SassMetricsFlushData_Params) F(CUpti_SassMetricsFlushData_Params, structSize)
    F(CUpti_SassMetricsFlushData_Params, pPriv) F(CUpti_SassMetricsFlushData_Params, ctx)
    F(CUpti_SassMetricsFlushData_Params, numOfPatchedInstructionRecords)
    F(CUpti_SassMetricsFlushData_Params, numOfInstances) F(CUpti_SassMetricsFlushData_Params, pMetricsData)
    END(CUpti_SassMetricsFlushData_Params_STRUCT_SIZE)
    printf("\n}\n");
}
